"""The stream job's data without Spark: hashed categorical ids (a table no vocabulary sizes) and the event
generator's drift (jobs/ctr_events.py, jobs/stream_ctr.py)."""

import numpy as np
import pytest

from sparkdl_train.datasets import ctr
from sparkdl_train.models.vocabulary import hashed_ids


def test_hashed_ids_give_each_field_its_own_rows_and_spread_values():
    rng = np.random.default_rng(0)
    raw = rng.integers(-(1 << 40), 1 << 40, size=(20_000, 3))
    ids = hashed_ids(raw, 64)
    assert ids.dtype == np.int32 and ids.shape == raw.shape
    for f in range(3):
        assert ids[:, f].min() >= f * 64 and ids[:, f].max() < (f + 1) * 64
        counts = np.bincount(ids[:, f] - f * 64, minlength=64)
        assert counts.min() > 0.7 * counts.mean() and counts.max() < 1.3 * counts.mean()  # about uniform
    np.testing.assert_array_equal(ids, hashed_ids(raw, 64))  # the same value, the same row, in every process
    same = np.array([[7, 7, 7]])
    assert len(set(hashed_ids(same, 1 << 20)[0] % (1 << 20))) == 3  # one value, a different row per field
    with pytest.raises(ValueError, match="buckets"):
        hashed_ids(raw, 0)


def test_events_after_the_drift_are_clicked_by_the_other_planted_model():
    spec = ctr.CTRSpec(rows=2 * ctr.BLOCK_ROWS, seed=42)
    planted, drifted = ctr.PlantedModel.make(spec), ctr.PlantedModel.make(ctr.CTRSpec(rows=spec.rows, seed=1042))
    plain = ctr.event_block(planted, 1)
    cols = ctr.event_block(planted, 1, drifted, drift_at=ctr.BLOCK_ROWS + 1000)
    after = cols["id"] >= ctr.BLOCK_ROWS + 1000
    assert after.sum() == ctr.BLOCK_ROWS - 1000 and set(cols["regime"][after]) == {1} and set(cols["regime"][~after]) == {0}
    np.testing.assert_array_equal(cols["label"][~after], plain["label"][~after])  # before the drift: unchanged
    np.testing.assert_array_equal(cols["C1"], plain["C1"])  # the same users and ads
    dense = np.stack([cols[c] for c in ctr.DENSE_COLS], axis=1).astype(np.float64)
    cats = np.stack([cols[c] for c in ctr.CAT_COLS], axis=1)
    np.testing.assert_allclose(cols["p_true"][after], drifted.probability(dense[after], cats[after]))
    # a different taste: the two models disagree on the same rows
    assert np.corrcoef(cols["p_true"][after], plain["p_true"][after])[0, 1] < 0.5


def test_a_streams_progress_is_its_trained_batches_rows_per_second_newest_lag_and_rolling_metrics():
    from sparkdl_train.driver.stream import BatchRecord, summarize
    from sparkdl_train.errors import ConfigError

    def trained(i, rows, seconds, auc, lag=None, attempts=1):
        return BatchRecord(i, rows=rows, seconds=seconds, attempts=attempts, prequential={"auc": auc}, reported=lag is not None,
                           lag=lag)

    batches = [BatchRecord(0, skipped="committed"), trained(1, 100, 1.0, 0.6, lag=900), trained(2, 300, 1.0, 0.7, lag=600),
               BatchRecord(3, skipped="empty"), trained(4, 500, 3.0, 0.8, attempts=3)]  # 4's report not in yet
    p = summarize(batches, committed=4, version=2, window=2)
    assert (p.trained_batches, p.trained_rows, p.committed, p.version) == (3, 900, 4, 2)
    assert p.rows_per_second == pytest.approx(800 / 4.0)  # the window: batches 2 and 4
    assert p.prequential == {"auc": pytest.approx(0.75)} and p.lag == 600 and p.failed_attempts == 2
    assert "200 rows/s" in str(p) and "lag 600" in str(p)
    whole = summarize(batches, 4, 2, window=10)
    assert whole.rows_per_second == pytest.approx(900 / 5.0) and whole.prequential["auc"] == pytest.approx(0.7)
    empty = summarize([BatchRecord(0, skipped="empty")], -1, None)
    assert (empty.trained_batches, empty.rows_per_second, empty.lag, empty.prequential) == (0, None, None, {})
    with pytest.raises(ConfigError, match="window"):
        summarize(batches, 4, 2, window=0)


def test_progress_reports_are_matched_to_their_micro_batches_and_lost_ones_not_looked_for_again():
    """StreamFit reads Spark's recentProgress onto the records still without a report; a micro-batch whose
    report left Spark's buffer (older than its oldest report) stays unreported, and later reads do not
    wait for it (each read would otherwise fetch the whole buffer again)."""
    from types import SimpleNamespace

    from sparkdl_train.driver.stream import BatchRecord, StreamFit

    class Query:
        reads = 0
        progress: list = []

        @property
        def recentProgress(self):  # noqa: N802 - StreamingQuery's name
            Query.reads += 1
            return self.progress

    records = [BatchRecord(batch_id=i) for i in range(4)]
    query = Query()
    query.progress = [{"batchId": 2, "sources": [{"metrics": {"maxOffsetsBehindLatest": "7"}}], "inputRowsPerSecond": 10.0,
                       "processedRowsPerSecond": 20.0}, {"batchId": 3, "sources": []}]
    fit = StreamFit(SimpleNamespace(batches=records), query)
    got = fit.batches
    assert [b.reported for b in got] == [False, False, True, True]
    assert (got[2].lag, got[2].input_rows_per_second, got[2].processed_rows_per_second) == (7, 10.0, 20.0)
    assert got[3].lag is None
    reads = Query.reads
    fit.batches  # noqa: B018 - batches 0 and 1 are gone from Spark's buffer: nothing to read for
    assert Query.reads == reads
    records.append(BatchRecord(batch_id=4))
    query.progress = query.progress + [{"batchId": 4, "sources": []}]
    assert fit.batches[4].reported and Query.reads == reads + 1
