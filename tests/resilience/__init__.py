"""The resilience suite's corpus of bad inputs and its process-level scenarios (kill -9, Argilla stop, key scan).

Used by tests/test_resilience.py (one pytest id per case) and bench/resilience.py (the figures table).
"""
