"""The plan: the contract between solve and run (its schema, the upgrade of older files, the
rank map as data, the fingerprint and the independent validator); nothing here costs or
searches."""
