"""URL slugs and word truncation."""

import re
import unicodedata


def slugify(text, separator="-", max_length=None):
    """Lower-case ASCII slug of ``text`` with words joined by ``separator``."""
    normalized = unicodedata.normalize("NFKD", text)
    ascii_text = normalized.encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-zA-Z0-9]+", ascii_text)
    slug = separator.join(word.lower() for word in words)
    if max_length is not None and len(slug) > max_length:
        slug = slug[:max_length]
        if separator in slug:
            slug = slug.rsplit(separator, 1)[0] if not slug.endswith(separator) else slug
        slug = slug.rstrip(separator)
    return slug


def truncate_words(text, count, suffix="..."):
    """Keep the first ``count`` words of ``text``; add ``suffix`` if any were dropped."""
    if count < 0:
        raise ValueError("count must be non-negative")
    words = text.split()
    if len(words) <= count:
        return " ".join(words)
    return " ".join(words[:count]) + suffix


def initials(name):
    """Upper-case initials of a name: ``'ada lovelace'`` -> ``'AL'``."""
    return "".join(part[0].upper() for part in name.split() if part)
