"""Stop strings over streamed tokens: however the text is split into tokens, the output ends
right before the earliest occurrence of any stop string (a reference on the whole text)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvtide.engine_server.app import StopMatcher

ALPHABET = "ab c"


def reference(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    at = min(i for i, _ in hits)
    return text[:at], next(s for i, s in hits if i == at)


@given(
    tokens=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=30),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 4), max_size=30),
)
def test_matches_the_whole_text_reference(
    tokens: list[str], stops: list[str], cuts: list[int]
) -> None:
    matcher = StopMatcher(tuple(stops))
    i, c = 0, 0
    while i < len(tokens) and matcher.active:
        n = cuts[c % len(cuts)] if cuts else 1
        matcher.check(tokens[i : i + n])
        i += n
        c += 1
    text, stop = reference("".join(tokens[:i]), tuple(stops))
    assert (matcher.text, matcher.matched) == (text, stop)
