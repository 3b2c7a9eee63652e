"""A YARN cluster with HDFS on one machine, for trying and testing sparkdl_train on YARN (``./run yarn up``)."""
