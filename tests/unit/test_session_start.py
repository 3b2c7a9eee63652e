"""A job's session start (sparkdl_train.driver.submit.start_session): started again after one of Spark's known
start-up races, never after anything else. The race's text is the one Spark 4's YARN client printed in this
project's CI (its AmIpFilter message handled while the UI's handlers were attached)."""

import pytest

from sparkdl_train.driver.submit import start_session
from sparkdl_train.failures import start_race

RACE = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
        ": java.lang.IllegalStateException: No filter named org.apache.spark.deploy.yarn.AmIpFilter\n"
        "\tat org.sparkproject.jetty.ee10.servlet.ServletHandler.updateMappings(ServletHandler.java:1239)")


# the second form, from a later CI run: Jetty's filter list changed while a page of the UI initialized
RACE_CME = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
            ": java.util.ConcurrentModificationException\n"
            "\tat java.base/java.util.ArrayList$ArrayListSpliterator.forEachRemaining(ArrayList.java:1631)\n"
            "\tat org.sparkproject.jetty.ee10.servlet.ServletHandler.initialize(ServletHandler.java:687)\n"
            "\tat org.apache.spark.ui.ServerInfo.addHandler(JettyUtils.scala:575)\n"
            "\tat org.apache.spark.ui.SparkUI.$anonfun$attachAllHandlers$2(SparkUI.scala:84)")


class Starts:
    """A builder's getOrCreate that fails with the given errors first, then returns a session."""

    def __init__(self, *errors: Exception):
        self.errors, self.calls = list(errors), 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return f"session {self.calls}"


def test_a_start_lost_to_the_yarn_ui_filter_race_is_started_again(caplog):
    start = Starts(RuntimeError(RACE))
    assert start_session(start) == "session 2" and start.calls == 2
    assert "known Spark start-up race" in caplog.text and "AmIpFilter" in caplog.text


def test_the_races_other_form_is_started_again_too():
    start = Starts(RuntimeError(RACE_CME))
    assert start_session(start) == "session 2"
    # the same exception anywhere else is not the race
    assert start_race(RuntimeError("java.util.ConcurrentModificationException\n\tat org.example.Other.run")) is None


def test_the_race_twice_in_a_row_fails_with_sparks_own_error():
    start = Starts(RuntimeError(RACE), RuntimeError(RACE))
    with pytest.raises(RuntimeError, match="No filter named"):
        start_session(start)
    assert start.calls == 2


@pytest.mark.parametrize("text", ["Cannot run program \"python3\": error=2", "Queue default is STOPPED",
                                  "No filter named org.example.SomethingElse"])
def test_any_other_start_failure_is_raised_at_once(text):
    start = Starts(RuntimeError(text))
    with pytest.raises(RuntimeError, match=text.split()[0]):
        start_session(start)
    assert start.calls == 1 and start_race(RuntimeError(text)) is None
