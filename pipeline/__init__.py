"""clariedge: build a query-clarification dataset from grounded dialogs and train a model on it."""

__version__ = "0.1.0"
