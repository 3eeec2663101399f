"""Greedy word wrapping and justification."""


def wrap(text, width):
    """Split ``text`` into lines of at most ``width`` characters (long words stay whole)."""
    if width < 1:
        raise ValueError("width must be positive")
    lines = []
    current = []
    length = 0
    for word in text.split():
        extra = len(word) if not current else len(word) + 1
        if current and length + extra > width:
            lines.append(" ".join(current))
            current = [word]
            length = len(word)
        else:
            current.append(word)
            length += extra
    if current:
        lines.append(" ".join(current))
    return lines


def justify(line, width):
    """Pad the gaps of ``line`` with spaces so that it is exactly ``width`` long."""
    words = line.split()
    if len(words) < 2 or len(line) >= width:
        return line
    gaps = len(words) - 1
    spaces = width - sum(len(word) for word in words)
    base, extra = divmod(spaces, gaps)
    out = []
    for index, word in enumerate(words[:-1]):
        out.append(word)
        out.append(" " * (base + (1 if index < extra else 0)))
    out.append(words[-1])
    return "".join(out)


def indent(lines, prefix="    "):
    """Prefix every non-empty line."""
    return [prefix + line if line.strip() else line for line in lines]
