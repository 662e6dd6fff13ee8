"""What the workflow's two sides share: its settings (config), the experiments expanded into runs (experiments), strict
YAML for its files (yamlfile), and the prior's check before a campaign (prior). Jobs (`sacglam_core.jobs`) and
reports (`sacglam_core.reports`) build on it and never on each other."""
