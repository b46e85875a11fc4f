"""How a CAR error reads: its message, the run and step it is about, then what to do."""

from __future__ import annotations

from car_core.errors import ModelUnavailable, StepOutOfRange


def test_the_hint_follows_the_message_as_one_sentence_after_another() -> None:
    """A client's message that ends its own sentence ("Connection error.") read
    "Connection error.. start the server" in a trial."""
    said = ModelUnavailable("Connection error.", hint="start the server")
    assert str(said) == "Connection error. start the server"
    plain = StepOutOfRange("step 9 does not exist", run_id="r1", hint="pick a step below 4")
    assert str(plain) == "step 9 does not exist [run r1]. pick a step below 4"
