"""Changelog insertion keeps everything else byte for byte, wherever the Unreleased section is."""

from __future__ import annotations

from kdtree.orchestrator.changelog import add_entries

LINE = "- p1 kernel passed (1/1 gates): x — run `r1`, cpu\n"


def test_appends_to_existing_added_list_before_its_blank_line():
    text = "# C\n\n## [Unreleased]\n\n### Added\n- a\n- b\n\n### Fixed\n- c\n\n## [1.0]\n- d\n"
    assert add_entries(text, [LINE]) == text.replace("- b\n", "- b\n" + LINE)


def test_creates_added_under_unreleased():
    text = "# C\n\n## [Unreleased]\n\n### Fixed\n- c\n\n## [1.0]\n- d\n"
    out = add_entries(text, [LINE])
    assert out == "# C\n\n## [Unreleased]\n\n### Added\n" + LINE + "\n### Fixed\n- c\n\n## [1.0]\n- d\n"


def test_creates_unreleased_before_the_first_release():
    text = "# C\n\nIntro.\n\n## [1.0]\n- d\n"
    out = add_entries(text, [LINE])
    assert out == "# C\n\nIntro.\n\n## [Unreleased]\n\n### Added\n" + LINE + "\n## [1.0]\n- d\n"


def test_creates_a_changelog_from_nothing():
    out = add_entries("", [LINE])
    assert out.startswith("# Changelog\n") and out.endswith("## [Unreleased]\n\n### Added\n" + LINE + "\n")


def test_no_lines_changes_nothing():
    assert add_entries("anything", []) == "anything"
