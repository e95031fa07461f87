"""Stop strings over streamed tokens: however the text is split into tokens, the output ends
right before the earliest occurrence of any stop string (a reference on the whole text)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from kvtide.engine_server.metrics import EngineMetrics
from kvtide.engine_server.stream import RequestStream, StopMatcher

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
    """And the matcher keeps a window of the text, not all of it: what it has not released
    and the few characters a stop string could start in."""
    matcher = StopMatcher(tuple(stops))
    out: list[str] = []
    i, c = 0, 0
    while i < len(tokens) and matcher.matched is None:
        n = cuts[c % len(cuts)] if cuts else 1
        matcher.check(tokens[i : i + n])
        if matcher.matched is None:
            out.append(matcher.release())
            assert len(matcher.text) <= max(map(len, stops)) - 1
        i += n
        c += 1
    out.append(matcher.release(final=True))
    text, stop = reference("".join(tokens[:i]), tuple(stops))
    assert ("".join(out), matcher.matched) == (text, stop)


@given(
    tokens=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=30),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    include=st.booleans(),
)
@example(tokens=["a", "a"], stops=["aa", "a"], include=False)  # found by the full suite's run
def test_a_stream_hands_over_only_final_text_and_stops_at_the_completing_token(
    tokens: list[str], stops: list[str], include: bool
) -> None:
    """Every prefix of what the stream hands over is a prefix of the final text (a stop
    string's start is held back until the request ends), and the tokens after the one
    completing a stop string count nowhere."""
    stream = RequestStream("r", 1, len(tokens) + 1, EngineMetrics("m"), 16)
    stream.stop_at(tuple(stops), include)
    sent: list[str] = []
    for t in tokens:
        stream.push(t)
        sent.extend(stream.pending)
        stream.pending.clear()
    stream.finish("length")
    sent.extend(stream.pending)
    # the text as far as the token that first completes a stop string: checked token by
    # token, as vLLM checks it, a short stop can end the request before a longer one listed
    # first would have matched at the same place (tokens "a", "a", stops "aa", "a")
    upto = next(
        (n for n in range(1, len(tokens) + 1) if any(s in "".join(tokens[:n]) for s in stops)),
        len(tokens),
    )
    text, stop = reference("".join(tokens[:upto]), tuple(stops))
    if include and stop is not None:
        text += stop
    assert "".join(sent) == text and stream.stop_reason == stop
    whole = ""
    for n, t in enumerate(tokens, 1):
        whole += t
        if any(s in whole for s in stops):
            assert stream.num_generated == n and stream.finish_reason == "stop"
            break
    else:
        assert stream.num_generated == len(tokens) and stream.finish_reason == "length"
