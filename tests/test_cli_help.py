"""Every ``autellix`` command explains itself: each flag of each command and
subcommand has help that shows its default, and a mistake is one line that
names the command it was made in."""

from __future__ import annotations

import argparse
import re

import pytest
from autellix_vllm.cli import build_parser, main


def leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, argparse.ArgumentParser]]:
    """(``autellix ...`` command, its parser) for every command that runs."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return [(" ".join(path), parser)]
    return [
        found
        for name, child in sub.choices.items()
        for found in leaf_commands(child, (*path, name))
    ]


COMMANDS = leaf_commands(build_parser())


def test_every_command_is_found():
    names = {name for name, _ in COMMANDS}
    assert {"ps", "top", "serve", "engine", "simulate run", "simulate sweep"} <= names
    assert {"bench engine", "bench scheduler", "bench router"} <= names


@pytest.mark.parametrize(("command", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_flag_has_help_that_shows_its_default(command, parser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        shown = formatter._expand_help(action) if action.help else ""
        assert shown, f"autellix {command} {action.option_strings[0]} has no help"
        if action.nargs != 0:  # an on/off switch has no default to show
            assert "(default" in shown or "default:" in shown, (command, action.option_strings)


def defaults_shown(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Option -> the defaults its help shows, ``(default...)`` as printed."""
    formatter = parser._get_formatter()
    return {
        action.option_strings[-1]: " ".join(re.findall(r"\(default[^)]*\)", expanded))
        for action in parser._actions
        if action.option_strings
        for expanded in [formatter._expand_help(action) if action.help else ""]
    }


@pytest.mark.parametrize(("command", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_defaults_read_one_way_and_a_switch_shows_none(command, parser):
    switches = {a.option_strings[-1] for a in parser._actions if a.nargs == 0}
    for option, shown in defaults_shown(parser).items():
        if option in switches:  # --no-program-end once read "(default: True)"
            assert "True" not in shown and "False" not in shown, (command, option, shown)
        elif shown:
            assert shown.startswith("(default: "), (command, option, shown)


@pytest.mark.parametrize(("command", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_default_shown_reads_as_a_closing_parenthesis(command, parser):
    """A default is shown once, as ``(default: ...)``, never inside other text."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        shown = formatter._expand_help(action) if action.option_strings and action.help else ""
        mentions = len(re.findall(r"default", shown))
        assert mentions == len(re.findall(r"\(default: ", shown)), (command, shown)


NEGATIVE_SWITCHES = [
    (command, parser, action)
    for command, parser in COMMANDS
    for action in parser._actions
    if any(option.startswith("--no-") for option in action.option_strings)
]


def test_there_are_negative_switches_to_check():
    assert {action.option_strings[0] for _, _, action in NEGATIVE_SWITCHES} >= {
        "--no-program-end",
        "--no-tool-calling",
    }


@pytest.mark.parametrize(
    ("command", "parser", "action"),
    NEGATIVE_SWITCHES,
    ids=[f"{command} {action.option_strings[0]}" for command, _, action in NEGATIVE_SWITCHES],
)
def test_a_negative_switch_shows_no_default_and_is_not_a_pair(command, parser, action):
    """``--no-x`` is a switch on its own whose help says what giving it does: no
    default to show (it is off until given), and no ``--x/--no-x`` pair whose help
    argparse would end with the positive flag's default."""
    assert action.nargs == 0 and len(action.option_strings) == 1, (command, action)
    assert not isinstance(action, argparse.BooleanOptionalAction), (command, action)
    shown = parser._get_formatter()._expand_help(action)
    assert "default" not in shown, (command, action.option_strings, shown)


def test_a_negative_switch_says_what_giving_it_does():
    simulate_run = dict(COMMANDS)["simulate run"]
    help_text = dict(
        (a.option_strings[-1], a.help) for a in simulate_run._actions if a.option_strings
    )["--no-program-end"]
    assert help_text.startswith("clients never end their programs")
    assert defaults_shown(simulate_run)["--no-program-end"] == ""


@pytest.mark.parametrize(
    ("argv", "prefix"),
    [
        (["simulate", "run", "--policy", "lottery"], "autellix simulate run: error: argument"),
        (["simulate", "run", "--trace", "/no/such/trace.jsonl"], "autellix simulate run: error:"),
        (["bench", "scheduler", "--steps", "0"], "autellix bench scheduler: error:"),
        (["ps", "--url", "localhost:8000"], "autellix ps: error:"),
        (["engine", "--model", "tiny", "--kv-offload-gib", "8"], "autellix engine: error:"),
        (["serve", "--device", "cpu", "--kv-offload-gib", "8"], "autellix serve: error:"),
    ],
)
def test_a_mistake_is_one_line_naming_the_subcommand(capsys, argv, prefix):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith(prefix) and len(error.splitlines()) == 1, error


def test_simulate_run_prints_each_value_with_its_unit(capsys):
    assert main(["simulate", "run", "--programs", "5", "--preset", "unit"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["rate"] == ["1", "programs/s"]
    assert rows["avg_latency_per_token"][1] == "s/token"
    assert rows["makespan"][1:] == ["s", "(simulated)"]
    assert rows["prefix_hit_rate"][1:] == ["of", "prompt", "tokens"]
    assert rows["policy"] == ["autellix"]  # no unit where there is none


def test_a_sweep_prints_a_table_of_max_rates_and_ratios():
    from autellix_vllm.sim.sweep import format_sweep

    result = {
        "workload": "sharegpt", "preset": "a100-llama8b", "engines": 1, "duration": 300.0,
        "programs": None, "seed": 0, "slo_factor": 5.0, "slo": 0.0431,
        "unloaded_latency_per_token": 0.00862, "max_rate": {"vllm-opt": 2.44, "autellix": 2.55},
        "ratio": {"vllm-opt": 1.0, "autellix": 1.045}, "censored": ["autellix"], "plot": "x.png",
        "tails": {"rate": 2.44, "by_policy": {
            "vllm-opt": {"avg_latency_per_token": 0.0402, "p95_program_latency": 151.2,
                         "p99_program_latency": 240.0, "avg_first_call_wait": 0.81,
                         "p95_first_call_wait": 3.5},
            "autellix": {"avg_latency_per_token": 0.0251, "p95_program_latency": 120.5,
                         "p99_program_latency": 260.25, "avg_first_call_wait": 0.12,
                         "p95_first_call_wait": 0.4}}},
    }  # fmt: skip
    assert format_sweep(result).splitlines() == [
        "sharegpt on 1 engine(s) of a100-llama8b, seed 0, 300 s of arrivals per rate",
        "SLO: 0.0431 s/token (5x the unloaded 0.00862 s/token)",
        "POLICY    MAX RATE (programs/s)  VS vllm-opt",
        "vllm-opt  2.44                   1.00x",
        "autellix  >= 2.55                1.04x",
        ">=: still within the SLO at the search limit",
        "",
        "each policy in full at 2.44 programs/s (seconds; AVG/TOKEN: s/token):",
        "POLICY    AVG/TOKEN  P95 PROGRAM  P99 PROGRAM  AVG FIRST WAIT  P95 FIRST WAIT",
        "vllm-opt  0.0402     151.2        240          0.81            3.5",
        "autellix  0.0251     120.5        260.2        0.12            0.4",
        "plot: x.png: left, average latency per token against arrival rate, one curve per"
        " policy (a policy's max rate is where its curve crosses the SLO, dashed); right,"
        " each policy's program latency CDF at the tails' rate",
    ]


def test_bench_engine_says_what_it_runs_on_stderr_with_json_on_stdout(monkeypatch, capsys):
    from autellix_vllm.bench import replay

    monkeypatch.setattr(replay, "run_engine_bench", lambda settings: {"avg_ratio": 1.5})
    assert main(["bench", "engine", "--quick", "--scheduler", "fcfs,autellix", "--json"]) == 0
    out, err = capsys.readouterr()
    assert out == '{"avg_ratio": 1.5}\n'
    assert err.startswith("autellix bench engine: 16 mixed programs on smollm2")
