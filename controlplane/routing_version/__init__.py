"""The version of desired routing state: one counter, advanced with every routing change.

Below topology and the catalog, which advance it in the same transaction as
each change they make; the snapshot domain (above them) reads it to label
and short-circuit snapshots. Kept apart from `snapshot` so that writers of
routing state never import the reader that assembles it.
"""
