"""Barrier-mode allreduce, executor side and pure: the ring schedule and its collectives
(:mod:`.ring`), the rows of embedding gradients gathered round the ring (:mod:`.row_gather`),
gradient buckets (:mod:`.buckets`), the ranks' authenticated TCP links (:mod:`.transport`), an
in-process ring for tests (:mod:`.local`) and the barrier's rendezvous with the driver
(:mod:`.barrier`). The engine that launches it is :mod:`sparkdl_train.driver.engines.allreduce`."""
