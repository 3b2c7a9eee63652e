"""Users' model shapes (bench/workloads/corpus.py) through the three parameter-server modes: synchronous rounds every
4 steps, asynchronous and hogwild pushes every step; held to Keras' held-out metric as tests/spark/test_model_corpus.py
says (``model_corpus.check_shape_through_engine``)."""

import pytest

from bench.workloads.corpus import PS_ENGINES, SHAPES, check_shape_through_engine


@pytest.mark.parametrize("engine", PS_ENGINES)
@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_trains_through_parameter_server(corpus_data, name, engine):
    check_shape_through_engine(corpus_data, name, engine)
