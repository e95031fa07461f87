"""docs/library.md is a doctest: every example on the library page runs, as printed."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def test_every_example_on_the_library_page_runs_as_printed() -> None:
    # Failures are printed in doctest's own diff format; pytest shows them with the assert.
    result = doctest.testfile(
        str(PAGE), module_relative=False, optionflags=doctest.ELLIPSIS, report=True
    )
    assert result.failed == 0
    assert result.attempted >= 50  # the page was parsed, not skipped


def test_the_page_has_no_example_that_is_not_tested() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        assert block.lstrip().startswith(">>> "), block
