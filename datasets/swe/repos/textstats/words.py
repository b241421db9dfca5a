"""Word statistics of plain text."""


def word_count(text: str) -> int:
    """Number of words: runs of characters between whitespace."""
    if not text:
        return 0
    return len(text.split(" "))


def longest_word(text: str) -> str:
    """The longest word (the first one on ties); empty text gives ''."""
    words = text.split()
    return max(words, key=len) if words else ""
