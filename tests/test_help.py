"""Help that teaches: every command's and group's --help has an Examples section, and every
example is a command line that proxytune accepts: its subcommands exist, its options belong
to the command they follow (with a value where they take one, a listed choice where they
have choices), its arguments fit. An option renamed or a command removed fails here, so an
example cannot rot."""

import re
import shlex

import click
import click.testing
import pytest

from proxytune.cli import main

EXAMPLES = re.compile(r"^\s*Examples\b[^:\n]*:\s*$")
COMMENT = re.compile(r"\s{2,}")         # an example, two spaces or more, then what it does
SHELL = (">", ">>", "|", "&&", "||", ";")   # where the shell takes over from proxytune


def tree(cmd=main, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from tree(sub, path + (name,))


def help_text(path) -> str:
    r = click.testing.CliRunner().invoke(main, [*path, "--help"], prog_name="proxytune", terminal_width=200)
    assert r.exit_code == 0, r.output
    return r.output


def examples(text: str) -> list[str]:
    """The lines of every Examples block: from its heading to the next blank line."""
    found, inside = [], False
    for line in text.splitlines():
        if EXAMPLES.match(line):
            inside = True
        elif inside and not line.strip():
            inside = False
        elif inside:
            found.append(COMMENT.split(line.strip(), 1)[0])
    return found


def option(cmd: click.Command, token: str) -> click.Option | None:
    name = token.split("=", 1)[0]
    return next((p for p in cmd.params if isinstance(p, click.Option) and name in p.opts + p.secondary_opts), None)


def takes_value(opt: click.Option) -> bool:
    return not opt.is_flag and not opt.count


def resolve(line: str) -> list[str]:
    """What is wrong with an example (empty when it is a command line proxytune accepts)."""
    words = shlex.split(line)
    words = words[:next((i for i, w in enumerate(words) if w in SHELL), len(words))]    # `... > FILE`
    if words[:1] != ["proxytune"]:
        return [f"does not start with `proxytune`: {line}"]
    cmd, words, problems, positional = main, words[1:], [], []
    while words:
        word = words.pop(0)
        if word == "--":
            positional += words
            break
        if word.startswith("-") and word != "-":
            opt = option(cmd, word)
            if opt is None:
                problems.append(f"{' '.join(cmd_path(cmd))}: no option {word}")
                continue
            if takes_value(opt) and "=" not in word:
                if not words:
                    problems.append(f"{word} needs a value")
                    continue
                value = words.pop(0)
                if isinstance(opt.type, click.Choice) and value not in opt.type.choices:
                    problems.append(f"{word} {value}: not one of {', '.join(opt.type.choices)}")
            continue
        if isinstance(cmd, click.Group) and not positional and word in cmd.commands:
            cmd = cmd.commands[word]
            continue
        if isinstance(cmd, click.Group) and not cmd.invoke_without_command or not _arguments(cmd):
            problems.append(f"{' '.join(cmd_path(cmd)) or 'proxytune'}: no subcommand or argument {word!r}")
            continue
        positional.append(word)
    return problems + _check_arguments(cmd, positional) + _check_required(cmd, line)


def _arguments(cmd) -> list[click.Argument]:
    return [p for p in cmd.params if isinstance(p, click.Argument)]


def _check_arguments(cmd, positional: list[str]) -> list[str]:
    args = _arguments(cmd)
    if isinstance(cmd, click.Group) and cmd.invoke_without_command is False and not positional:
        return [f"{' '.join(cmd_path(cmd)) or 'proxytune'} is a group: an example must name a command"]
    fixed = sum(a.nargs for a in args if a.nargs > 0)
    variadic = any(a.nargs < 0 for a in args)
    needed = sum(a.nargs for a in args if a.nargs > 0 and a.required) + sum(1 for a in args if a.nargs < 0 and
                                                                            a.required)
    if len(positional) < needed or (len(positional) > fixed and not variadic):
        return [f"{' '.join(cmd_path(cmd))}: {len(positional)} argument(s) {positional} do not fit "
                f"{' '.join(a.human_readable_name for a in args) or 'no arguments'}"]
    return []


def _check_required(cmd, line: str) -> list[str]:
    words = shlex.split(line)
    return [f"{' '.join(cmd_path(cmd))}: {p.opts[0]} is required" for p in cmd.params
            if isinstance(p, click.Option) and p.required and not any(w.split("=")[0] in p.opts for w in words)]


def cmd_path(cmd) -> list[str]:
    for path, c in tree():
        if c is cmd:
            return list(path)
    return []


COMMANDS = [path for path, _ in tree()]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "proxytune")
def test_every_help_has_examples_that_resolve(path):
    found = examples(help_text(path))
    assert found, f"`proxytune {' '.join(path)} --help` has no Examples section"
    assert any(shlex.split(e)[1:1 + len(path)] == list(path) for e in found) or not path, \
        f"no example of `proxytune {' '.join(path)}` itself: {found}"
    problems = [f"{e}: {p}" for e in found for p in resolve(e)]
    assert problems == []


@pytest.mark.parametrize("line, problem", [
    ("proxytune tune chek", "no subcommand or argument 'chek'"),
    ("proxytune tune check --no-such-option", "no option --no-such-option"),
    ("proxytune tune export --format yaml", "not one of"),
    ("proxytune tune export -o x.yml", "--format is required"),
    ("proxytune tune check --profile", "needs a value"),
    ("proxytune profiles show", "do not fit"),
    ("proxytune profiles show a b", "do not fit"),
    ("proxytune tune", "is a group"),
    ("proxytune tune apply --yes --persist", None),
    ("proxytune --root /srv/img tune apply --files-only --yes", None),
    ("proxytune probe cachemiss -- ./server --idle 5000", None),
    ("proxytune tune check --only=sysctl:*", None),
    ("proxytune fleet check -i hosts.ini --json > fleet.json", None),
])
def test_the_example_checker_catches_rot(line, problem):
    """The checker itself: a rotten example is caught (and a good one is not)."""
    found = resolve(line)
    if problem is None:
        assert found == []
    else:
        assert any(problem in p for p in found), found
