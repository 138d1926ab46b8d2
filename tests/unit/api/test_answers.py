"""Model-sized answers (``api/answers.py``): the cap holds for any mix of sections, every character is safe, and the
budget is shared fairly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.api.answers import Answer, _fair_shares, field

ALPHABET = ["a", "b", " ", "\n", "\t", "\r", "\x1b", "\x00", "\x9b", "\u202e", "\u2028", "\ud800", "é", "😀", "\\"]


def _safe(text: str) -> bool:
    return text.replace("\n", "").replace("\t", "").isprintable()


def test_fair_shares_meet_small_demands_whole_and_split_the_rest() -> None:
    assert _fair_shares([10, 1_000, 50_000], 3_000) == [10, 1_000, 1_990]
    assert _fair_shares([5_000, 5_000], 3_000) == [1_500, 1_500]
    assert _fair_shares([1, 2], 100) == [1, 2]
    assert _fair_shares([], 100) == []


def test_a_field_is_one_safe_line_of_at_most_its_limit() -> None:
    assert field("plain") == "plain"
    assert field("a\nb\x1b") == "a\\nb\\x1b"
    long = field("\x1b" * 1_000, 50)
    assert len(long) <= 50 and long.endswith("...") and _safe(long) and "\n" not in long


@pytest.mark.parametrize("seed", range(40))
def test_any_mix_of_sections_fits_the_limit_and_is_safe(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    answer = Answer()
    answer.line("status: success")
    for index in range(rng.randint(1, 6)):
        size = rng.choice([0, 10, 1_000, 30_000, 300_000])
        text = "".join(rng.choice(ALPHABET) * rng.randint(1, 50) for _ in range(size // 25 + 1))[:size]
        file = None
        if rng.random() < 0.3:
            file = tmp_path / f"{seed}-{index}.stdout"
            file.write_bytes(text.encode("utf-8", "surrogatepass") + bytes(range(256)))
        answer.section(f"section {index}", text, file=file, inline=rng.random() < 0.5)
    limit = rng.choice([2_000, 5_000, 20_000])
    kept: list[str] = []
    text = answer.render(limit, lambda label, whole: kept.append(whole) or None)
    assert len(text) <= limit and _safe(text)
    assert text.count("[... ") == text.count("was cut to fit this answer")


def test_a_file_read_in_the_middle_of_a_character_shows_no_half_characters(tmp_path: Path) -> None:
    for text in ["é" * 3_000_000, "😀" * 2_000_000, "a" + "€" * 3_000_000]:
        path = tmp_path / "whole.stdout"
        path.write_text(text)
        for limit in range(2_000, 2_040):
            answer = Answer()
            answer.section("stdout", "preview", file=path)
            shown = answer.render(limit, lambda label, whole: None)
            assert "\\udc" not in shown and "bytes left out" in shown and len(shown) <= limit
            head, tail = shown.split("\n[... ")[0], shown.split(" left out ...]\n")[1].split("\nnote:")[0]
            left = int(shown.split("[... ")[1].split(" bytes")[0].replace(",", ""))
            assert len((head.removeprefix("stdout:\n") + tail).encode()) + left == len(text.encode())


def test_a_short_text_of_control_characters_is_shown_whole_as_escapes() -> None:
    """Its share is what its escapes take, not its raw length (which would cut all of it)."""
    answer = Answer()
    answer.line("status: success")
    answer.section("stdout", "\x1b]0;owned\x07\x1b[2J\u202e\n")
    text = answer.render(2_000, lambda label, whole: None)
    assert "left out" not in text and "\\x1b]0;owned\\x07\\x1b[2J\\u202e" in text, text
