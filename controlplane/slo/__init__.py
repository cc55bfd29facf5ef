"""SLO documents generated from the catalog and the drill runs that measured each figure."""
