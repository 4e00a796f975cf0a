"""Result JSON (one schema for audits, benchmarks and probes) -> Markdown / HTML;
measurements.py is the one spec of each measurement the report runs."""
