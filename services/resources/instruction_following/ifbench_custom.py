"""IFBench's task-specific instructions (`custom:*`): each checks one fixed task's answer shape
(multiples of 7, CSV tables, reversed sentences, ...), with IFBench's verdicts. None takes kwargs."""
from __future__ import annotations

import csv
import io
import re
import unicodedata
from typing import Any

from .args import Check, Spec
from .text import PUNCTUATION, split_sentences, strip_punctuation

_EDGE = PUNCTUATION + " "
EUROPEAN_CAPITALS_BY_LATITUDE = (
    "Reykjavik Helsinki Oslo Tallinn Stockholm Riga Moscow Copenhagen Vilnius Minsk Dublin Berlin Amsterdam "
    "Warsaw London Brussels Prague Luxembourg Paris Vienna Bratislava Budapest Vaduz Chisinau Bern Ljubljana "
    "Zagreb").split()
_OPTION = re.compile(r"^[A-Ea-e][\.|\)]\s*\w+")
_QUESTION = re.compile(r"\n*(?:Question \d+[\.|\):;]?\s*)")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SPECIAL_FIELD = re.compile(r'".*[^\d\w\s].*"')
_PRODUCT_HEADER = re.compile(r'^(ProductID|"ProductID"),[ \t]*(Category|"Category"),[ \t]*(Brand|"Brand"),'
                             r'[ \t]*(Price|"Price"),[ \t]*(Stock|"Stock")$')
_STUDENT_HEADER = re.compile(r'^(StudentID|"StudentID")\t *(Subject|"Subject")\t *(Grade|"Grade")'
                             r'\t *(Semester|"Semester")\t *(Score|"Score")$')


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ASCII", "ignore").decode("ASCII")


def _no_kwargs(check: Check) -> Any:
    return lambda iid, kw: check


def multiples(t: str) -> bool:
    return re.findall(r"\d+", t.replace(",", ", ")) == [str(i) for i in range(14, 51, 7)]


def mcq_count_length(t: str) -> bool:
    if t[t.find("Question"):] != t:  # anything before the first question fails
        return False
    questions = [q.strip() for q in _QUESTION.split(t) if q.strip()]
    if len(questions) != 4:
        return False
    lengths = []
    for question in questions:
        text, options, answering = "", 0, False
        for line in question.split("\n"):
            if _OPTION.match(line.strip()):
                options += 1
                answering = True
            elif not answering:
                text += " " + line.strip()
        if options != 5:
            return False
        lengths.append(len(text.strip()))
    return all(a < b for a, b in zip(lengths, lengths[1:]))


def reverse_newline(t: str) -> bool:
    lines = [line.strip(_EDGE) for line in t.split("\n") if line.strip(_EDGE)]
    start = next((i for i, line in enumerate(lines) if "Zimbabwe" in line), None)
    if start is None or len(lines) - start < 52:
        return False
    countries = [_ascii(line) for line in lines[start:]]
    return countries == sorted(countries, reverse=True)


def word_reverse(t: str) -> bool:
    value = " ".join(strip_punctuation(t.lower().strip()).split()[::-1])
    return "bald eagle" in value and value in split_sentences(value)


def character_reverse(t: str) -> bool:
    return "elgae dlab" in t.lower()


def sentence_alphabet(t: str) -> bool:
    sentences = split_sentences(t)
    if len(sentences) != 26:
        return False
    for i, sentence in enumerate(sentences):
        words = sentence.lstrip().split()
        if not words or words[0].lower()[0] != chr(97 + i):
            return False
    return True


def european_capitals_sort(t: str) -> bool:
    capitals = [c for c in _ascii(t).split(",") if c.strip()]
    return [c.strip() for c in capitals] == EUROPEAN_CAPITALS_BY_LATITUDE


def _csv_rows(text: str, delimiter: str = ",") -> list[list[str]]:
    """The rows, or none when the csv module rejects the text (IFBench raises there: a fail)."""
    try:
        return list(csv.reader(io.StringIO(text), delimiter=delimiter))
    except csv.Error:
        return []


def csv_city(t: str) -> bool:
    rows = _csv_rows(t)
    return (len(rows) == 8 and rows[0] == ["ID", "Country", "City", "Year", "Count"]
            and all(len(row) == 5 for row in rows[1:]))


def csv_special_character(t: str) -> bool:
    if not _PRODUCT_HEADER.match(t.split("\n")[0].strip()):
        return False
    rows = _csv_rows(t.replace('"', '"""'))  # IFBench triples quotes to keep them in fields
    if len(rows) != 15:
        return False
    for row in rows[1:]:
        if len(row) != 5:
            return False
        if any(_SPECIAL_FIELD.match(field) for field in row):
            return True
    return False


def csv_quotes(t: str) -> bool:
    if not _STUDENT_HEADER.match(t.split("\n")[0].strip()):
        return False
    rows = _csv_rows(t.replace('"', '"""'), delimiter="\t")
    if len(rows) != 4:
        return False
    for row in rows:
        if len(row) != 5:
            return False
        for field in row:
            field = field.strip()
            if not field or field[0] != '"' or field[-1] != '"':  # an empty field fails (IFBench raises)
                return False
    return True


def _valid_date(date: str) -> bool:
    if not _DATE.match(date):
        return False
    year, month, day = (int(part) for part in date.split("-"))
    longest = 31 if month in (1, 3, 5, 7, 8, 10, 12) else 30 if month in (4, 6, 9, 11) else 29 if month == 2 else 99
    return 1769 <= year <= 1821 and month <= 12 and day <= longest


def date_format_list(t: str) -> bool:
    return all(_valid_date(date.strip()) for date in t.strip().split(","))


REGISTRY: dict[str, Spec] = {
    "custom:multiples": Spec(_no_kwargs(multiples)),
    "custom:mcq_count_length": Spec(_no_kwargs(mcq_count_length)),
    "custom:reverse_newline": Spec(_no_kwargs(reverse_newline)),
    "custom:word_reverse": Spec(_no_kwargs(word_reverse)),
    "custom:character_reverse": Spec(_no_kwargs(character_reverse)),
    "custom:sentence_alphabet": Spec(_no_kwargs(sentence_alphabet)),
    "custom:european_capitals_sort": Spec(_no_kwargs(european_capitals_sort)),
    "custom:csv_city": Spec(_no_kwargs(csv_city)),
    "custom:csv_special_character": Spec(_no_kwargs(csv_special_character)),
    "custom:csv_quotes": Spec(_no_kwargs(csv_quotes)),
    "custom:date_format_list": Spec(_no_kwargs(date_format_list)),
}
