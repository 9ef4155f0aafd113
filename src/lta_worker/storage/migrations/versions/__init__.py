"""Migration revisions; `migrate.REVISIONS` lists their ids in order."""
