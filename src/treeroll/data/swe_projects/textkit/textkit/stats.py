"""Word statistics."""

import re


def words(text):
    """Lower-case words of ``text`` (letters, digits and apostrophes)."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_count(text):
    """Number of words."""
    return len(words(text))


def frequencies(text):
    """Map each word to how many times it occurs."""
    counts = {}
    for word in words(text):
        counts[word] = counts.get(word, 0) + 1
    return counts


def most_common(text, n):
    """The ``n`` most frequent words, ties broken alphabetically."""
    counts = frequencies(text)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word for word, _ in ranked[:n]]


def average_word_length(text):
    """Mean length of the words (0.0 for no words)."""
    found = words(text)
    if not found:
        return 0.0
    return sum(len(word) for word in found) / len(found)


def is_palindrome(text):
    """True if the letters and digits of ``text`` read the same backwards."""
    cleaned = [c.lower() for c in text if c.isalnum()]
    return cleaned == cleaned[::-1]
