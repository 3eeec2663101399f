from textkit.stats import (
    average_word_length,
    frequencies,
    is_palindrome,
    most_common,
    word_count,
    words,
)


def test_words_lowercase():
    assert words("Hello, World") == ["hello", "world"]


def test_word_count():
    assert word_count("one two  three") == 3


def test_frequencies():
    assert frequencies("a b a") == {"a": 2, "b": 1}


def test_most_common_ties():
    assert most_common("b a c a b d", 3) == ["a", "b", "c"]


def test_average_word_length():
    assert average_word_length("ab abcd") == 3.0


def test_average_empty():
    assert average_word_length("") == 0.0


def test_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")


def test_not_palindrome():
    assert not is_palindrome("treeroll")
