"""Word tokenisers and stop-word lists, each defined once: the construction, the filter, the clean stage's
features and the evaluation metrics read words through these."""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")
_ALNUM = re.compile(r"[a-z0-9]+")
_NUMBER_TOKEN = re.compile(r"[a-z0-9]+(?:[.,][0-9]+)*", re.I)


def wordset(text: str) -> frozenset[str]:
    """The whitespace-separated words of `text` as a set: how the word lists here are written."""
    return frozenset(text.split())


def cased_words(text: str) -> list[str]:
    """Words as typed: letters and digits with an apostrophe suffix ("don't", "user's"), ’ read as '."""
    return [w.replace("’", "'") for w in _WORD.findall(text)]


def words(text: str) -> list[str]:
    """`cased_words` lower-cased: the construction's tokeniser."""
    return [w.lower() for w in cased_words(text)]


def alnum_tokens(text: str) -> list[str]:
    """Lower-cased runs of ASCII letters and digits; apostrophes and decimal points split ("3.5" -> "3", "5")."""
    return _ALNUM.findall(text.lower())


def number_tokens(text: str) -> list[str]:
    """Lower-cased letters and digits, a decimal or thousands number kept whole ("3.5"; "1,200" -> "1200")."""
    return [t.lower().replace(",", "") for t in _NUMBER_TOKEN.findall(text)]


STOP = wordset(
    "a about above after again against all also am an and any are aren't as at be because been before being below "
    "between both but by can can't could couldn't did didn't do does doesn't doing don't down during each few for "
    "from further get gets got had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers "
    "herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more "
    "most mustn't my myself no nor not of off on once only or other ought our ours ourselves out over own same "
    "shan't she she'd she'll she's should shouldn't so some such than that that's the their theirs them "
    "themselves then there there's these they they'd they'll they're they've this those through to too under "
    "until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's which "
    "while who who's whom why why's will with won't would wouldn't you you'd you'll you're you've your yours "
    "yourself yourselves ok okay please tell know like can could would want need give provide explain describe "
    "mean meant also just really thanks thank yes well much many way ways one ones still even though something "
    "anything thing things kind sort lot lots get got make made use used using regarding regard related relation "
    "respect context specific specifically particular case"
)
"""Function words and request filler ("please", "explain", "specific"): no topic in a turn (construction)."""

METRIC_STOP = wordset(
    "a an the of in on at to for from by with and or is are was were be been do does did you your mean which what "
    "who whom whose when where how about that this these those it its as into than then"
)
"""Function and question words, left out of a clarification's content words (evaluation metrics)."""

FUNCTION_WORDS = wordset("the and for with that this from about which what")
"""The commonest function words of 3+ letters, left out of an interpretation's content (filter)."""
