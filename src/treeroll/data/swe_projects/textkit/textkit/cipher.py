"""Classical ciphers."""

ALPHABET_SIZE = 26


def shift_char(char, shift):
    """Shift one letter by ``shift`` places, keeping its case; other characters unchanged."""
    if char.isupper():
        base = ord("A")
    elif char.islower():
        base = ord("a")
    else:
        return char
    return chr((ord(char) - base + shift) % ALPHABET_SIZE + base)


def caesar(text, shift):
    """Caesar cipher."""
    return "".join(shift_char(char, shift) for char in text)


def rot13(text):
    """ROT13 (its own inverse)."""
    return caesar(text, 13)


def vigenere(text, key, decrypt=False):
    """Vigenere cipher with an alphabetic key; non-letters do not consume key letters."""
    if not key or not key.isalpha():
        raise ValueError("key must be a non-empty alphabetic string")
    shifts = [ord(k) - ord("a") for k in key.lower()]
    out = []
    position = 0
    for char in text:
        if char.isalpha():
            shift = shifts[position % len(shifts)]
            out.append(shift_char(char, -shift if decrypt else shift))
            position += 1
        else:
            out.append(char)
    return "".join(out)
