"""One grammar for durations and sizes, whoever reads them: CLI flags, ORCH_* variables, Settings, eval options."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.errors import ConfigError
from orchestrator.units import (
    duration_argument,
    optional_duration_argument,
    parse_duration,
    parse_size,
    positive_duration_argument,
    size_argument,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2048", 2048),
        (2048, 2048),
        ("0", 0),
        ("100b", 100),
        ("1k", 1024),
        ("512m", 512 << 20),
        ("512M", 512 << 20),
        ("512mb", 512 << 20),
        ("512MiB", 512 << 20),
        ("10MB", 10 << 20),
        ("2g", 2 << 30),
        (" 2 G ", 2 << 30),
        ("1.5g", 3 << 29),
        (".5k", 512),
        ("1t", 1 << 40),
    ],
)
def test_a_size_is_read_as_docker_reads_it(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1", "5x", "1.5", "m", "1 0m", "1e3", "nan", "10mbb", "2p"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ConfigError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize("value", [True, 1.5, None, -1])
def test_a_size_is_text_or_a_whole_non_negative_int(value):
    with pytest.raises(ConfigError, match="size"):
        parse_size(value)


def test_durations_refuse_infinity():
    for value in ("inf", float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="duration"):
            parse_duration(value)
    assert parse_duration(".5m") == 30.0


def test_every_flag_reader_speaks_the_same_grammar():
    assert duration_argument("5m") == positive_duration_argument("5m") == optional_duration_argument("5m") == 300.0
    assert duration_argument("0") == 0.0 and optional_duration_argument("") is None
    assert size_argument("10MB") == 10 << 20
    for reader, text in [
        (duration_argument, "5 minutes"),
        (positive_duration_argument, "0s"),
        (size_argument, "lots"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            reader(text)
