"""Hostile text from a run, tried one payload at a time: every terminal payload placed in a run's
id, agent, error, action and observation reaches ``car runs``, ``car show``, ``car show --full``
and their ``--json`` forms as visible escapes (nothing executes, no markup is parsed, JSON keeps
the exact value), and every HTML payload placed in every text field of the report stays text
(no tag, attribute or URL it carries reaches the page). One test case per payload, so the count
of cases is the count of payloads tried."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from _report_data import hostile_contrastive, hostile_run, shapley_dict

from car_core.cli.kit import safe
from car_core.model.trajectory import Outcome, Step, Trajectory
from car_core.report import render_attribution, render_run
from car_core.store import RunStore
from car_core.testing import synthetic as syn

TERMINAL = {
    "csi-clear-screen": "\x1b[2J\x1b[H",
    "sgr-colour": "\x1b[31mred\x1b[0m",
    "erase-previous-line": "\x1b[1A\x1b[2K",
    "osc8-hyperlink": "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07",
    "osc52-clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "osc-window-title": "\x1b]0;owned\x1b\\",
    "dcs-string": "\x1bP+q544e\x1b\\",
    "c1-csi": "\x9b2J",
    "bell": "ring\x07",
    "backspace-overwrite": "safe\x08\x08\x08\x08evil",
    "carriage-return-overwrite": "innocent\rEVIL",
    "nul": "a\x00b",
    "delete": "a\x7fb",
    "bidi-rlo": "\u202egnp.exe",
    "bidi-isolates": "\u2066a\u2067b\u2068c\u2069",
    "bidi-embeddings": "\u202aa\u202bb\u202c",
    "bidi-marks": "\u061ca\u200eb\u200f",
    "rich-link": "[link=http://evil.example]innocent[/link]",
    "rich-close-tag": "id[/]",
    "rich-style": "[bold red on white]owned[/]",
    "rich-emoji-code": ":skull: [blink]x[/blink]",
}
HTML = {
    "script": "<script>window.__pwned = 1</script>",
    "img-onerror": '<img src="x" onerror="window.__pwned = 2">',
    "pre-breakout-svg-onload": '</pre></div><svg onload="window.__pwned = 3"></svg>',
    "attribute-breakout": '" onmouseover="window.__pwned = 4" x="',
    "single-quote-breakout": "' onfocus='window.__pwned = 5' autofocus='",
    "iframe-javascript-url": '<iframe src="javascript:window.__pwned = 6"></iframe>',
    "anchor-javascript-url": '<a href="javascript:window.__pwned = 7">x</a>',
    "style-breakout": "</style><script>window.__pwned = 8</script>",
    "comment-breakout": "--><script>window.__pwned = 9</script><!--",
    "cdata-breakout": "]]><script>window.__pwned = 10</script>",
    "meta-refresh": '<meta http-equiv="refresh" content="0;url=http://evil.example">',
    "base-href": '<base href="http://evil.example/">',
    "svg-script": "<svg><script>window.__pwned = 11</script></svg>",
    "template-injection": "{{ 7 * 7 }}{% raw %}${7*7}",
    "entity-smuggling": "&lt;script&gt;window.__pwned = 12&lt;/script&gt;",
}
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def terminal_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One store holding, per payload, a run whose id, agent and error carry it, and one run
    whose every step carries one payload as action and observation; every read command run
    once over it."""
    folder = tmp_path_factory.mktemp("hostile")
    steps = [Step(i, f"action-{name}:{p}", f"observation-{name}:{p}", True)
             for i, (name, p) in enumerate(TERMINAL.items())]
    agent = "agent:" + "".join(TERMINAL.values())
    shown = Trajectory.new(context="ctx", steps=steps, id="shown", agent=agent,
                           error="error:" + "".join(TERMINAL.values()), outcome=Outcome(1.0))
    with RunStore(folder / "car.db") as s:
        s.save(shown)
        for name, p in TERMINAL.items():
            s.save(Trajectory.new(context="ctx", steps=[Step(0, "a", None, False)],
                                  id=f"id-{name}:{p}", agent=f"agent-{name}:{p}"))
    out = {}
    for key, args in {"runs": ["runs"], "runs --json": ["runs", "--json"],
                      "show": ["show", "shown"], "show --full": ["show", "shown", "--full"],
                      "show --json": ["show", "shown", "--json"]}.items():
        proc = cli(*args, cwd=folder)
        assert proc.returncode == 0, (key, proc.stderr)
        out[key] = proc.stdout
    return out


@pytest.mark.parametrize("name", list(TERMINAL))
def test_terminal_payload_is_shown_as_text(terminal_outputs: dict[str, Any], name: str) -> None:
    payload = TERMINAL[name]
    raw = set(_UNSAFE.findall(payload))
    for key, stdout in terminal_outputs.items():
        assert not raw & set(stdout), (key, raw & set(stdout))  # nothing reaches the terminal raw
    # the tables and step lines show the payload, escaped and with its markup as written
    assert f"id-{name}:{safe(payload)}" in terminal_outputs["runs"]
    assert f"agent-{name}:{safe(payload)}" in terminal_outputs["runs"]
    for key in ("show", "show --full"):
        assert f"action-{name}:{safe(payload)}" in terminal_outputs[key], key
    assert f"observation-{name}:{safe(payload)}" in terminal_outputs["show --full"]
    # JSON is still the same value
    listed = {r["id"]: r for r in json.loads(terminal_outputs["runs --json"])}
    assert listed[f"id-{name}:{payload}"]["agent"] == f"agent-{name}:{payload}"
    data = json.loads(terminal_outputs["show --json"])
    step = next(s for s in data["steps"] if s["action"] == f"action-{name}:{payload}")
    assert step["observation"] == f"observation-{name}:{payload}"
    assert payload in data["agent"] and payload in data["error"]


_URL_ATTRS = {"href", "src", "action", "formaction", "xlink:href", "content", "data", "srcdoc"}


class _Page(HTMLParser):
    """What a browser builds from the page: elements, attribute names, the values of the
    attributes that load or navigate (``_URL_ATTRS``) and the text, references decoded."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.values: list[str] = []
        self.text: list[str] = []
        self.lines = 0
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tspan" and {n for n, _ in attrs} == {"x", "y"}:
            # a line of a wrapped plot label: a longer text wraps onto more of them, so they
            # are counted apart from the elements the payload must not add
            self.lines += 1
            return
        self.tags.append(tag)
        self.attrs.extend(name for name, _ in attrs)
        self.values.extend(v or "" for n, v in attrs if n in _URL_ATTRS)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _with_text(text: str) -> tuple[Trajectory, Trajectory, dict[str, Any], dict[str, Any]]:
    """The report's hostile chat run with ``text`` in every field the page shows: messages,
    roles, tool output, actions, the agent, the model, plot labels and parameters."""
    run, branch = hostile_run()

    def field(value: Any) -> Any:
        if isinstance(value, str):
            return text
        if isinstance(value, list):
            return [field(v) for v in value]
        if isinstance(value, dict):
            return {k: (field(v) if k in ("content", "role", "name", "arguments") else
                        field(v) if isinstance(v, (dict, list)) else v)
                    for k, v in value.items()}
        return value

    steps = tuple(replace(s, action=field(s.action), observation=field(s.observation),
                          state=field(s.state), meta={"model": text}) for s in run.steps)
    run = replace(run, steps=steps, agent=text, context=field(run.context))
    branch = replace(branch, steps=tuple(replace(s, action=field(s.action)) if i else
                                         steps[0] for i, s in enumerate(branch.steps)))
    contrastive = hostile_contrastive(run, branch)
    contrastive["params"] = {"note": text}
    shapley = shapley_dict(syn.and_game())
    for v in shapley["values"]:
        v["label"] = text
    return run, branch, contrastive, shapley


def _pages(text: str) -> list[str]:
    run, _, contrastive, shapley = _with_text(text)
    return [render_attribution(contrastive, run=run), render_attribution(shapley, run=run),
            render_run(run)]


BENIGN = [_Page(page) for page in _pages("plain words")]


@pytest.mark.parametrize("name", list(HTML))
def test_html_payload_stays_text_in_the_report(name: str) -> None:
    payload = HTML[name]
    for page, benign in zip(_pages(payload), BENIGN, strict=True):
        built = _Page(page)
        assert sorted(built.tags) == sorted(benign.tags)  # no element the payload carries
        assert built.lines >= benign.lines
        assert sorted(built.attrs) == sorted(benign.attrs)  # no attribute either
        assert not [v for v in built.values if "javascript:" in v or "evil.example" in v]
        assert sorted(built.values) == sorted(benign.values)  # nothing loads or navigates
        assert payload in "".join(built.text)  # it is there, as text
