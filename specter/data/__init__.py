"""Text the suite ships or finds offline: calibration corpora now; prompt sets by name as they land."""
