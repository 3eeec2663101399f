import pytest

from textkit.wrap import indent, justify, wrap


def test_wrap_lines():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    assert wrap("aaaa bbbb", 9) == ["aaaa bbbb"]


def test_wrap_long_word():
    assert wrap("tiny enormousword x", 5) == ["tiny", "enormousword", "x"]


def test_wrap_empty():
    assert wrap("", 5) == []


def test_wrap_bad_width():
    with pytest.raises(ValueError):
        wrap("a", 0)


def test_justify():
    assert justify("a bb c", 11) == "a    bb   c"


def test_justify_single_word():
    assert justify("word", 10) == "word"


def test_justify_length():
    assert len(justify("one two three", 20)) == 20


def test_indent_skips_blank():
    assert indent(["a", "", "b"], "> ") == ["> a", "", "> b"]
