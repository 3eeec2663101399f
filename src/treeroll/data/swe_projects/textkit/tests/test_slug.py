import pytest

from textkit.slug import initials, slugify, truncate_words


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_separator():
    assert slugify("a b  c", separator="_") == "a_b_c"


def test_slugify_accents():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_slugify_max_length_cuts_at_word():
    assert slugify("one two three", max_length=9) == "one-two"


def test_slugify_short_enough():
    assert slugify("one two", max_length=20) == "one-two"


def test_truncate_words():
    assert truncate_words("a b c d", 2) == "a b..."


def test_truncate_words_no_cut():
    assert truncate_words("a b", 2) == "a b"


def test_truncate_words_negative():
    with pytest.raises(ValueError):
        truncate_words("a", -1)


def test_initials():
    assert initials("ada  king lovelace") == "AKL"
