"""The HTML report: verdict first, plots drawn from the numbers, agent text always escaped."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html import escape
from html.parser import HTMLParser

import pytest
from _report_data import (
    BREAKOUT,
    IMG,
    SCRIPT,
    contrastive_dict,
    hostile_contrastive,
    hostile_run,
    shapley_dict,
)

from car_core.errors import InvalidInput
from car_core.report import render_attribution, render_run
from car_core.report.plots import (
    LABEL_GAP,
    LABEL_MAX,
    MARGIN,
    PLOT_H,
    PLOT_W,
    UNTESTED_FILL,
    text_width,
    wrap_label,
)
from car_core.testing import synthetic as syn


class _Tags(HTMLParser):
    """Every start tag and attribute name the browser would build from the page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.classes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(name for name, _ in attrs)
        self.classes.extend((v or "") for n, v in attrs if n == "class")


def parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    return p


def test_verdict_comes_first_and_names_the_locus_with_its_interval(pivot_model, pivot_run):
    html = render_attribution(contrastive_dict(pivot_model, pivot_run), run=pivot_run)
    verdict = html.index('id="verdict"')
    assert verdict < html.index('id="rescue"') < html.index('id="timeline"')
    rescue = pivot_model.rescue(2)
    # The sentence carries the locus, its rescue and its interval (half width 0.15 in the input).
    assert "Step 2 is where this run committed to failure" in html
    assert f"by {rescue:.2f}, interval [{rescue - 0.15:.2f}, {rescue + 0.15:.2f}]" in html


def test_rescue_plot_draws_untested_steps_as_shaded_columns_not_as_zero(pivot_model, pivot_run):
    html = render_attribution(contrastive_dict(pivot_model, pivot_run, untested=(0, 4)),
                              run=pivot_run)
    plot = html[html.index('id="rescue-plot"'):html.index("</svg>", html.index('id="rescue-plot"'))]
    groups = re.findall(r'<g class="(point(?: untested)?)">(.*?)</g>', plot, re.S)
    assert len(groups) == pivot_model.n_steps
    untested = [body for cls, body in groups if cls == "point untested"]
    assert len(untested) == 2
    for body in untested:
        # no mark on the value axis at all: a full-height shaded column and a "?"
        assert "<circle" not in body and "(no rescue measured)</title>" in body
        column = re.search(r'<rect class="untested-column" [^>]*y="([0-9.]+)" [^>]*'
                           r'height="([0-9.]+)" fill="([^"]+)"', body)
        assert column and float(column.group(1)) == MARGIN["top"]
        assert float(column.group(2)) == PLOT_H - MARGIN["top"] - MARGIN["bottom"]
        assert column.group(3) == UNTESTED_FILL
        assert '>?</text>' in body
    tested = [body for cls, body in groups if cls == "point"]
    assert all("<circle" in body and "untested" not in body for body in tested)
    # titled in the table's words: why each was not tested
    assert "<title>step 0: before the locus (no rescue measured)</title>" in untested[0]
    # The legend names the style with the same colour; the table says "not tested".
    legend = html[html.index('<p class="legend">'):html.index("</p>", html.index('class="legend"'))]
    assert f'class="swatch untested" style="background:{UNTESTED_FILL}' in legend
    assert "not a rescue of 0" in legend
    assert html.count('<tr class="untested">') == 2
    # The locus is drawn larger and red; exactly one mark.
    assert plot.count('r="7"') == 1


def test_a_ruled_out_step_is_titled_as_the_table_says(pivot_model, pivot_run):
    """A step the later stage ruled out has no rescue measured as a number, but it was tested:
    its column says "ruled out" with the level, as the table does (it said "not tested")."""
    r = contrastive_dict(pivot_model, pivot_run, untested=(3, 4, 5))
    r["indifference"] = 0.1
    for s in r["steps"]:
        s["ruled_out"] = s["step"] > 2
    html = render_attribution(r, run=pivot_run)
    for k in (3, 4, 5):
        assert (f"<title>step {k}: ruled out, re-deciding it moves P(fail) by less than "
                "10%</title>") in html


def test_legend_leaves_out_the_untested_style_when_every_step_was_tested(pivot_model, pivot_run):
    html = render_attribution(contrastive_dict(pivot_model, pivot_run), run=pivot_run)
    assert "swatch untested" not in html and "untested-column" not in html


def test_arms_plot_bars_are_proportional_to_failure_probability(pivot_model, pivot_run):
    html = render_attribution(contrastive_dict(pivot_model, pivot_run), run=pivot_run)
    start = html.index('id="arms-plot"')
    plot = html[start:html.index("</svg>", start)]
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([0-9.]+)"', plot)]
    assert len(heights) == pivot_model.n_steps + 1
    # Pixel height = P(fail) * the plot's inner height (the y axis spans [0, 1]).
    inner = PLOT_H - MARGIN["top"] - MARGIN["bottom"]
    for j, h in enumerate(heights):
        assert h == pytest.approx(max(pivot_model.arm(j) * inner, 0.5), abs=0.02)


def test_shapley_report_shows_values_and_the_efficiency_check():
    model = syn.and_game()
    r = shapley_dict(model)
    html = render_attribution(r)
    start = html.index('id="shapley-plot"')
    plot = html[start:html.index("</svg>", start)]
    assert plot.count('<g class="bar">') == model.n_steps
    phi = model.shapley()
    assert f"{phi[0]:.3f}" in html  # 0.455 for the AND game at p_bad 0.3
    assert 'id="efficiency"' in html
    assert f"Σφ = <b>{sum(phi):.3f}</b>" in html
    # Steps 0 and 1 of the AND game have the same value: neither is named alone.
    assert "Step 0 and step 1 tie for the largest share of the blame" in html
    assert "carries the largest share" not in html


def _values(*estimates_and_cis):
    return [{"step": k, "label": f"step {k}", "estimate": e, "ci": list(ci), "n": 100}
            for k, (e, ci) in enumerate(estimates_and_cis)]


def _headline(html: str) -> str:
    return re.search(r'<p class="headline">([^<]*)</p>', html).group(1)


def test_shapley_headline_names_one_step_only_when_its_interval_clears_the_others():
    r = shapley_dict(syn.and_game())
    r["values"] = _values((0.6, (0.5, 0.7)), (0.2, (0.1, 0.3)), (0.0, (-0.1, 0.1)))
    assert _headline(render_attribution(r)) == "Step 0 carries the largest share of the blame"


def test_shapley_headline_says_overlapping_leaders_cannot_be_told_apart():
    r = shapley_dict(syn.and_game())
    # Step 2 is largest but step 0's interval reaches step 2's lower end (0.30 >= 0.30).
    r["values"] = _values((0.25, (0.2, 0.3)), (0.05, (0.0, 0.1)), (0.4, (0.3, 0.5)))
    html = render_attribution(r)
    assert _headline(html) == ("Step 2 and step 0 cannot be told apart: either may carry the "
                               "largest share of the blame")
    assert "the intervals overlap, so this budget does not rank them" in html


def test_shapley_headline_with_equal_values_names_all_of_them_in_step_order():
    r = shapley_dict(syn.and_game())
    r["values"] = _values((0.1, (0.0, 0.2)), (0.3, (0.29, 0.31)), (0.3, (0.29, 0.31)),
                          (0.3, (0.29, 0.31)))
    assert _headline(render_attribution(r)) == ("Step 1, step 2 and step 3 tie for the largest "
                                               "share of the blame")


def test_shapley_headline_counts_many_contenders_and_the_detail_names_them_all():
    r = shapley_dict(syn.and_game())
    r["values"] = _values(*[(0.3 - 0.01 * k, (0.25 - 0.01 * k, 0.35 - 0.01 * k))
                            for k in range(5)])
    html = render_attribution(r)
    assert _headline(html) == ("5 steps cannot be told apart: any of them may carry the largest "
                               "share of the blame")
    detail = re.search(r'<p class="detail">([^<]*)</p>', html).group(1)
    assert all(f"step {k} 0.{30 - k}" in detail for k in range(5))


def test_shapley_headline_keeps_an_agent_name_as_written():
    r = shapley_dict(syn.and_game())
    r["values"] = _values((0.6, (0.5, 0.7)), (0.1, (0.0, 0.2)))
    r["values"][0]["label"] = "LangGraph researcher, step 0 (its 1st decision)"
    assert _headline(render_attribution(r)).startswith("LangGraph researcher, step 0")


def _shapley_labels(html: str) -> tuple[float, list[list[str]]]:
    start = html.index('id="shapley-plot"')
    plot = html[start:html.index("</svg>", start)]
    label_x = float(re.search(r'<text class="label" x="([0-9.]+)"', plot).group(1))
    labels = [re.findall(r"<tspan [^>]*>([^<]*)</tspan>", t)
              for t in re.findall(r'<text class="label"[^>]*>(.*?)</text>', plot)]
    return label_x, labels


def test_shapley_label_column_is_as_wide_as_its_longest_label():
    r = shapley_dict(syn.and_game())
    long = "account_agent, step 4 (its 1st decision)"
    r["values"][1]["label"] = long
    label_x, labels = _shapley_labels(render_attribution(r))
    assert labels[1] == [long]  # one line, whole
    # The labels end at label_x and the longest one still starts inside the picture.
    assert label_x - text_width(long) >= LABEL_GAP


def test_a_label_too_long_for_the_column_wraps_and_keeps_every_word():
    r = shapley_dict(syn.and_game())
    long = ("the customer-service triage agent that reads every incoming ticket, step 4 "
            "(its 1st decision)")
    r["values"][0]["label"] = long
    label_x, labels = _shapley_labels(render_attribution(r))
    assert len(labels[0]) > 1 and " ".join(labels[0]) == long
    assert all(text_width(line) <= PLOT_W * LABEL_MAX for line in labels[0])
    assert label_x - max(text_width(line) for line in labels[0]) >= LABEL_GAP


def test_wrap_label_breaks_a_word_longer_than_the_line():
    word = "x" * 80
    lines = wrap_label(word, 100)
    assert "".join(lines) == word and all(text_width(t) <= 100 for t in lines)


def test_no_locus_says_why():
    model = syn.no_cause()
    run = model.failing_run()
    r = contrastive_dict(model, run)
    r["reason"] = "no step's rescue interval excludes zero"
    html = render_attribution(r, run=run)
    assert "No cause: no step could be blamed." in html and "Answer: no cause" in html
    assert "no step&#39;s rescue interval excludes zero" in html
    assert 'id="locus"' not in html


def test_truncated_result_is_flagged(pivot_model, pivot_run):
    r = contrastive_dict(pivot_model, pivot_run)
    r.update(truncated=True, budget_note="rollout budget of 100 reached")
    html = render_attribution(r, run=pivot_run)
    assert "The budget ran out" in html and "rollout budget of 100 reached" in html


def test_every_piece_of_agent_text_is_escaped():
    run, branch = hostile_run()
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    tags = parse(html)
    assert "script" not in tags.tags and "img" not in tags.tags
    assert not [a for a in tags.attrs if a.startswith("on")]
    # The payloads are there, as text.
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    assert "&lt;img src=&#34;x&#34; onerror=&#34;window.__pwned = 2&#34;&gt;" in html
    assert "&lt;/pre&gt;&lt;/div&gt;&lt;svg onload=" in html
    assert "support &lt;b&gt;agent&lt;/b&gt;" in html
    for raw in (SCRIPT, IMG, BREAKOUT):
        assert raw not in html


def test_labels_roles_model_names_and_tool_names_are_escaped_too():
    """The fields the template puts in attributes, tags and plot labels, not only in <pre>."""
    run, branch = hostile_run()
    steps = [replace(s, meta={"model": IMG}) for s in run.steps]
    state = [{**m, "role": 'x" onmouseover="window.__pwned = 4'} for m in steps[1].state]
    steps[1] = replace(steps[1], state=state)
    run = replace(run, steps=tuple(steps))
    shapley = shapley_dict(syn.and_game())
    shapley["values"][0]["label"] = SCRIPT
    for html in (render_attribution(hostile_contrastive(run, branch), run=run),
                 render_attribution(shapley, run=run), render_run(run)):
        tags = parse(html)
        assert "script" not in tags.tags and "img" not in tags.tags
        assert not [a for a in tags.attrs if a.startswith("on")]
        assert IMG not in html and SCRIPT not in html


def test_agent_chosen_roles_never_become_class_names():
    """A role is the agent's text: ``system tag locus`` must not style a message as the locus
    badge. The four chat roles get their style; any other role is ``role-other``, and the
    role itself is still shown in the message."""
    run, branch = hostile_run()
    state = [{**m, "role": "system tag locus"} if m["role"] == "system" else m
             for m in run.steps[1].state]
    steps = list(run.steps)
    steps[1] = replace(steps[1], state=state)
    run = replace(run, steps=tuple(steps))
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    locus = html[html.index('id="locus"'):html.index('id="diff"')]
    classes = re.findall(r'<div class="([^"]*)"><pre>', locus)
    assert classes == ["msg role-other", "msg role-user", "msg role-assistant", "msg role-tool"]
    assert "[system tag locus]" in locus


def test_the_agents_earlier_decisions_the_run_began_from_are_marked():
    """A trial's report showed a first turn's note among the messages the locus decided from
    as if the run had written it; `car what` calls it "(before this run)", so does the
    report. The run's own decisions are not marked."""
    run, branch = hostile_run()
    earlier = [{"role": "user", "content": "Pay ACC-200 next week."},
               {"role": "assistant", "content": "Noted: payee ACC-290."}]
    steps = tuple(replace(st, state=earlier + list(st.state)) for st in run.steps)
    run = replace(run, steps=steps)
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    locus = html[html.index('id="locus"'):html.index('id="diff"')]
    assert "(before this run) [assistant] Noted: payee ACC-290." in locus
    assert "[assistant] Looking it up" in locus
    assert "(before this run) [assistant] Looking it up" not in locus
    assert "(before this run) [user]" not in locus


def test_the_content_security_policy_also_pins_base_and_form_targets(pivot_model, pivot_run):
    """``base-uri`` and ``form-action`` do not fall back to ``default-src``, so they are
    named; ``frame-ancestors`` cannot be set from a ``<meta>`` policy (browsers ignore it
    there and log an error, which the browser test would catch), so it is not."""
    html = render_attribution(contrastive_dict(pivot_model, pivot_run), run=pivot_run)
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives == {"default-src": "'none'", "style-src": "'unsafe-inline'",
                          "img-src": "data:", "base-uri": "'none'", "form-action": "'none'"}


def test_page_is_self_contained_and_forbids_scripts(pivot_model, pivot_run):
    html = render_attribution(contrastive_dict(pivot_model, pivot_run), run=pivot_run)
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "<link" not in html and "<script" not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def test_locus_context_and_diff_of_the_rescued_branch():
    run, branch = hostile_run()
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    locus = html[html.index('id="locus"'):html.index('id="diff"')]
    # The exact messages step 1 decided from: system, user, step 0's call and its tool result.
    assert locus.count('class="msg role-') == 4
    assert "[tool lookup_order] order 17: shipped." in locus
    diff = html[html.index('id="diff"'):html.index('id="timeline"')]
    rows = re.findall(r'<tr class="(equal|replace|delete|insert)">', diff)
    assert rows[0] == "equal"  # step 0 was held: identical on both sides
    assert "replace" in rows
    assert "I cannot refund more than it cost." in diff
    assert "outcome: 1.00" in diff and "outcome: 0.00" in diff


def test_accepts_a_result_object_and_renders_a_bare_run(pivot_model, pivot_run):
    class Result:
        def to_dict(self):
            return contrastive_dict(pivot_model, pivot_run)

    assert "Step 2 is where" in render_attribution(Result())
    html = render_run(pivot_run)
    assert "No attribution yet" in html
    assert html.count('<li class="">') + html.count('<li class="locus">') == len(pivot_run.steps)


def test_unknown_method_is_refused():
    with pytest.raises(InvalidInput, match="unknown attribution method"):
        render_attribution({"method": "vibes"})


# -- through the real estimators ------------------------------------------------------------------
def test_real_contrastive_result_renders_itself(pivot_model, pivot_run):
    import car_core as car
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          rollouts=32, seed=0)
    assert res.locus == pivot_model.locus
    html = res.to_html()
    assert html == res._repr_html_()
    assert f"Step {pivot_model.locus} is where this run committed to failure" in html
    plot = html[html.index('id="rescue-plot"'):]
    assert plot[:plot.index("</svg>")].count('<g class="point') == pivot_model.n_steps
    # With the run attached: the timeline, the locus context and the rescued branch's diff.
    full = render_attribution(res, run=pivot_run)
    assert full.count('<li class="locus">') == 1 and 'id="locus"' in full
    diff = full[full.index('id="diff"'):full.index('id="timeline"')]
    assert "outcome: 1.00" in diff and "outcome: 0.00" in diff
    # Notebook conversions: rows per step and JSON that round-trips.
    assert len(res.table()) == pivot_model.n_steps
    assert json.loads(res.to_json()) == json.loads(json.dumps(res.to_dict()))


def test_the_plot_label_gives_the_n_of_the_sample_its_rescue_comes_from(pivot_model, pivot_run):
    """A re-estimated step's rescue and interval come from the re-estimate's pairs, and the
    table says so; the plot's label beside the same numbers gave the test's n instead."""
    import car_core as car
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          rollouts=32, seed=0)
    s = res.steps[pivot_model.locus]
    assert s.estimate == "refit" and s.refit_n != s.n
    html = res.to_html()
    assert f"step {s.step}: rescue " in html
    label = html[html.index(f"step {s.step}: rescue "):]
    assert label[:label.index("</title>")].endswith(f", n={s.refit_n}")


def test_real_shapley_result_renders_itself():
    import car_core as car
    model = syn.and_game()
    run = model.failing_run()
    sh = car.shapley(run, model.agent(), outcome=model.outcome, budget=400, seed=0)
    html = sh.to_html()
    plot = html[html.index('id="shapley-plot"'):]
    assert plot[:plot.index("</svg>")].count('<g class="bar">') == len(sh.values)
    assert f"Σφ = <b>{sh.total:.3f}</b>" in html


def test_long_run_folds_the_held_prefix_in_context_and_diff():
    import car_core as car
    model = syn.late_pivot()  # 24 steps, locus 20
    run = model.failing_run()
    res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=64, seed=0)
    assert res.locus == model.locus == 20
    html = render_attribution(res, run=run)
    locus = html[html.index('id="locus"'):html.index('id="diff"')]
    # Steps 0-13 fold away; the 6 steps before the locus stay in view; nothing is dropped.
    assert "steps 0–13 (14 earlier steps)" in locus
    for k in range(20):
        assert f"step {k} action" in locus
    diff = html[html.index('id="diff"'):html.index('id="timeline"')]
    # The held prefix (steps 0-17 with observations: 36 lines, plus step 18's action) folds,
    # keeping 3 identical lines before the first change.
    folded = re.search(r"<summary>(\d+) identical lines</summary>", diff)
    assert folded and int(folded.group(1)) == 2 * 20 - 3
    assert diff.count('<tr class="equal">') == 2 * 20  # every line is still in the page


# -- latency and tokens ----------------------------------------------------------------------------
def _costs_table(html: str) -> list[list[str]]:
    table = html[html.index('<table class="costs">'):html.index("</table>",
                                                                 html.index('class="costs"'))]
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row)
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>")[1])]


def test_latency_and_tokens_per_step_as_the_recorder_stored_them():
    """Recorders store ``meta["latency_s"]`` and ``meta["usage"]``; a step without them shows
    ``—``, and the totals count only what was recorded."""
    run, branch = hostile_run()
    metas = [{"latency_s": 0.4123, "usage": {"prompt_tokens": 120, "completion_tokens": 8}},
             {"latency_s": 2.5, "usage": {"prompt_tokens": 300, "completion_tokens": 12}},
             {}]
    run = replace(run, steps=tuple(replace(s, meta=m) for s, m in zip(run.steps, metas,
                                                                       strict=True)))
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    rows = _costs_table(html)
    assert rows == [["0", "—", "412 ms", "120", "8"], ["1", "—", "2.50 s", "300", "12"],
                    ["2", "—", "—", "—", "—"], ["all", "", "2.91 s", "420", "20"]]
    assert '<details class="costs" open>' in html
    # and on the step itself, where the timeline shows it
    assert '<span class="tag cost">412 ms</span>' in html
    assert '<span class="tag cost">300 in / 12 out tokens</span>' in html


def test_a_run_without_latency_or_tokens_says_so_with_dashes(pivot_model, pivot_run):
    html = render_run(pivot_run)
    rows = _costs_table(html)
    assert len(rows) == pivot_model.n_steps + 1
    assert all(row[2:] == ["—", "—", "—"] for row in rows)
    assert "stored no latency or token counts" in html and 'class="tag cost"' not in html


def test_the_report_says_every_caveat_the_result_carries(pivot_model, pivot_run):
    """A trial's result carried "branches ran it for real" (a destructive tool named safe) and
    the noisy judge's caveat; its report page, which the docs said shows them, had neither."""
    r = contrastive_dict(pivot_model, pivot_run)
    said = ["safe_tools names 'refund_invoice', but its MCP server annotates it "
            "destructiveHint=True: branches ran it for real",
            "re-scored with every step held as recorded, the run failed in 88% of re-runs"]
    html = render_attribution({**r, "caveats": said}, run=pivot_run)
    for c in said:
        shown = escape(c, quote=False).replace("'", "&#39;")  # as the template escapes it
        assert f'<div class="warn caveat">Caveat: {shown}</div>' in html
    assert 'class="warn caveat"' not in render_attribution(r, run=pivot_run)


def test_the_rescue_table_says_not_ruled_out_where_the_plot_and_the_cli_do(pivot_model,
                                                                            pivot_run):
    """A trial's report table said "not tested" for later steps whose arms ran 29 and 32
    branches, beside a plot and a CLI that said "not ruled out": the table's "tested" column
    now takes the words of the plain table (``formatting.step_row``), a step ruled out too."""
    r = contrastive_dict(pivot_model, pivot_run, untested=(3, 4, 5))
    r["indifference"], r["not_ruled_out"] = 0.1, [3, 4]
    r["steps"][5]["ruled_out"] = True
    html = render_attribution(r, run=pivot_run)
    table = html[html.index("<summary>Rescue table</summary>"):]
    table = table[:table.index("</table>")]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(
        r"<tr class=\"[^\"]*\">(?:.*?)<td>([^<]*)</td></tr>", table, re.S)]
    assert cells[3:] == ["not ruled out", "not ruled out", "ruled out"], cells
    assert "not tested" not in table


def test_the_headline_names_who_decided_the_locus_without_nesting(pivot_model, pivot_run):
    """A trial's report title read "Step 1 is where this run committed to failure (model,
    step 1 (its 2nd decision))": the step's label whole, in brackets after its own step."""
    steps = tuple(replace(s, meta={**s.meta, "agent": "model"}) for s in pivot_run.steps)
    run = replace(pivot_run, steps=steps)
    html = render_attribution(contrastive_dict(pivot_model, run), run=run)
    said = "Step 2 is where this run committed to failure (decided by model, its 3rd decision)"
    assert f"<title>CAR · {said}</title>" in html
    assert "(model, step 2" not in html


def test_the_report_of_a_stopped_attribution_says_interrupted_as_the_list_does(
        pivot_run, tmp_path):
    """A user trial's `car attributions` listed an attribution a blocked side effect stopped
    as "interrupted", and `car report --attribution` said "has no result yet (status
    running)". Stored as running with no live claim, it stopped: both say so."""
    from car_core.report.pages import run_page
    from car_core.store import RunStore
    with RunStore(tmp_path / "car.db") as db:
        db.save(pivot_run)
        aid = db.begin_attribution(pivot_run.id, "contrastive", {})
        db.release_attribution(aid)
        with pytest.raises(InvalidInput, match=rf"attribution {aid} has no result yet "
                                               r"\(interrupted\)"):
            run_page(db, pivot_run, attribution=aid)
