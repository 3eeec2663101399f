import pytest

from textkit.cipher import caesar, rot13, shift_char, vigenere


def test_shift_char_wraps():
    assert shift_char("z", 1) == "a"
    assert shift_char("A", -1) == "Z"


def test_shift_char_other():
    assert shift_char("!", 5) == "!"


def test_caesar():
    assert caesar("Hello, World", 3) == "Khoor, Zruog"


def test_caesar_roundtrip():
    assert caesar(caesar("Attack at dawn", 7), -7) == "Attack at dawn"


def test_rot13_involution():
    assert rot13(rot13("Treeroll")) == "Treeroll"
    assert rot13("abc") == "nop"


def test_vigenere():
    assert vigenere("attack at dawn", "lemon") == "lxfopv ef rnhr"


def test_vigenere_decrypt():
    assert vigenere("lxfopv ef rnhr", "lemon", decrypt=True) == "attack at dawn"


def test_vigenere_bad_key():
    with pytest.raises(ValueError):
        vigenere("abc", "k3y")
