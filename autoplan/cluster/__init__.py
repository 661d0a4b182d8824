"""Clusters and GPUs: the cluster file's schema and the GPU catalog it is checked against."""
