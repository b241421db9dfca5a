from words import longest_word, word_count


def test_single_spaces():
    assert word_count("a b c") == 3


def test_longest():
    assert longest_word("to be or not") == "not"
