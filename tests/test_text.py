"""The shared tokenisers and stop-word lists (clariedge.text)."""

from __future__ import annotations

from clariedge.text import FUNCTION_WORDS, METRIC_STOP, STOP, alnum_tokens, cased_words, number_tokens, words


def test_words_keep_apostrophe_suffixes_and_read_curly_quotes_as_straight() -> None:
    assert words("Don’t use the User's card!") == ["don't", "use", "the", "user's", "card"]
    assert cased_words("Don’t use the User's card!") == ["Don't", "use", "the", "User's", "card"]


def test_alnum_tokens_split_apostrophes_and_decimals() -> None:
    assert alnum_tokens("Don't pay 3.5% of $1,200") == ["don", "t", "pay", "3", "5", "of", "1", "200"]


def test_number_tokens_keep_decimals_and_thousands_whole() -> None:
    assert number_tokens("Pay 3.5% of $1,200 in 2024.") == ["pay", "3.5", "of", "1200", "in", "2024"]
    assert number_tokens("v2.0 or 2, 3") == ["v2.0", "or", "2", "3"]


def test_stop_words_leave_the_topic() -> None:
    assert [w for w in words("Could you please explain the refund policy?") if w not in STOP] == ["refund", "policy"]
    assert [t for t in alnum_tokens("Which of these plans do you mean?") if t not in METRIC_STOP] == ["plans"]
    assert {"the", "which"} <= FUNCTION_WORDS and "refund" not in FUNCTION_WORDS | METRIC_STOP | STOP
