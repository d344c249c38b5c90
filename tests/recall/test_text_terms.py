"""The mirror's tokenizing (``rank.text_terms``, run on every indexed message) counts
what the token-by-token reading counts: the same stems, CJK characters and bigrams, and the
same length, whatever the text mixes."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from ragent_memory.cli.demo import simulate_session
from ragent_memory.core.memo import Memo
from ragent_memory.recall.rank import text_terms
from ragent_memory.text.keys import token_count
from ragent_memory.text.porter import fold, stem, tokens
from ragent_memory.text.terms import WORD, index_terms, is_cjk, search_terms, term_set


def token_by_token(text: str) -> tuple[dict[str, int], int]:
    """The reference: unicode61's tokens of the spaced text, stemmed one by one, and each
    pair of adjacent single-CJK tokens as a bigram."""
    found = tokens(index_terms(text))
    counts: dict[str, int] = {}
    for token, count in Counter(found).items():
        key = token if token[-1] in "0123456789" else stem(token)
        counts[key] = counts.get(key, 0) + count
    previous = ""
    for token in found:
        single = len(token) == 1 and is_cjk(token)
        if single and previous:
            counts[previous + token] = counts.get(previous + token, 0) + 1
        previous = token if single else ""
    return counts, len(found)


PIECES = [
    "painting",
    "Paintings",
    "the",
    "4711",
    "ORD-12345",
    "a_b",
    "x2",
    "running",
    "Café",
    "naïve",
    "ΑΘΗΝΑ",
    "Москва",
    "µs",
    "ſtraße",
    "İstanbul",
    "北京",
    "马拉松比赛",
    "退",
    "カタカナ",
    "々",
    "ｶﾀｶﾅ",
    "・",
    "゠",
    "한국어",
    "١٢٣",
    "²",
    "·",
    "[sso setup · doc 0]",
    "\u212b",  # the angstrom sign: lower-cased, a letter fold changes
    "\u212a",  # the kelvin sign: lower-cased, ASCII k
    "\u2126",
    "。",
    "，",
    "！",
    " ",
    "  ",
    "\n",
    "-",
    "_",
    ".",
    "",
]


def test_text_terms_counts_what_the_token_by_token_reading_counts() -> None:
    rng = random.Random(5)
    texts = ["", " ", "_", "北", "北京", "a", "ab"]
    for _ in range(4_000):
        texts.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14))))
    for turn in simulate_session(40):
        texts.extend(m["content"] for m in turn if m.get("content"))
    for text in texts:
        assert text_terms(text) == token_by_token(text), repr(text)


@given(st.text(alphabet=st.sampled_from("aZ9 _.-\t\n\x00\x1f~é北"), max_size=40))
def test_a_rows_length_is_counted_as_its_tokens(text: str) -> None:
    """A row's length measured as it is indexed (``token_count``) is the number of tokens
    the ranker counts for it, ASCII or not, empty or all separators."""
    assert token_count(index_terms(text)) == len(tokens(index_terms(text)))
    assert token_count(index_terms(text)) == text_terms(text)[1]


def test_index_terms_spaces_each_cjk_character() -> None:
    assert index_terms("a订单b。・x") == "a 订  单 b。 ・ x"
    assert index_terms("plain text") == "plain text"


@given(
    st.lists(st.sampled_from([*PIECES, "the", "an", "Straße", "ǅ", "ﬁ"]), max_size=14).map("".join)
)
def test_term_set_is_search_terms_without_order_or_limit(text: str) -> None:
    """``term_set`` (a sentence's terms, as a set) holds exactly ``search_terms``' terms."""
    assert set(search_terms(text, limit=10_000)) == term_set(text)


@given(st.text(alphabet="ab Z_9.,;'\t\n·éÉßİµſ中文の\u3000\xa0\u0301ﬁ²٣😀-", max_size=30))
def test_tokens_are_unicode61s_runs_of_letters_and_digits(text: str) -> None:
    """``tokens`` splits in C but reads what one regex match a token reads: each run of
    letters and digits, lower-cased, folded where it has non-ASCII chars."""
    reading = [t if t.isascii() else fold(t) for t in WORD.findall(text.lower())]
    assert tokens(text) == reading


def test_memo_answers_many_keys_in_order_computing_each_missing_once() -> None:
    asked: list[str] = []
    memo = Memo(lambda key: asked.append(key) or (None if key == "none" else key.upper()), 6, len)
    assert memo.many(["ab", "none", "ab"]) == ["AB", None, "AB"]
    assert memo("none") is None and memo.many(["ab"]) == ["AB"]
    assert asked == ["ab", "none"]  # None is an answer kept like any other
    # 2 + 4 + 2 + 2 chars > 6: the least recently used ("none") goes
    assert memo.many(["cd", "ef"]) == ["CD", "EF"]
    assert memo("ab") == "AB" and memo("none") is None
    assert asked == ["ab", "none", "cd", "ef", "none"]
