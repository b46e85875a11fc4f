"""The ``car`` command: list and show stored runs, intervene on a step, attribute a failure,
look inside the step and rank fixes, write the HTML report, and run the demo. Errors from CAR
print one line with what to do next and map to exit codes a script can branch on (see
``car --help``).

``app`` (the group, its consoles, shared options and exit-code table) is in ``car_core.cli.app``;
each command group is a module beside it, added to ``app`` here, in the order ``car --help``
lists them."""

from __future__ import annotations

from car_core.cli import browse, context, demo, fix_population, intervene, kit, triage
from car_core.cli.app import app, err, main, out
from car_core.cli.attribute import attribute
from car_core.cli.attribute import print_result as _print_result
from car_core.cli.demo import _builtin_demo
from car_core.cli.kit import ExecutorName

app.command()(browse.runs)
app.command()(browse.show)
app.command()(intervene.intervene)
app.command()(attribute)
app.command("triage")(triage.triage_command)
app.command()(browse.report)
app.command()(browse.attributions)
app.command()(demo.demo)
app.command("what")(context.what)
app.command("fix")(context.fix)
context.export_app.command("triage")(triage.export_triage)
context.export_app.command("fix")(fix_population.export_fix)
app.add_typer(context.export_app)

# The command's entry point and what the tests reach for under this package's name.
__all__ = ["ExecutorName", "_builtin_demo", "_print_result", "app", "err", "kit",
           "main", "out"]
