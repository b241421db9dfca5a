"""Roman numerals."""

_VALUES = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(number: int) -> str:
    """Roman numeral of 1 <= number <= 3999."""
    if not 1 <= number <= 3999:
        raise ValueError("number out of range")
    out = []
    for value, letters in _VALUES:
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)
