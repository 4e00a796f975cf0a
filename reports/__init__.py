"""Result JSON (one schema for audits, benchmarks and probes) -> Markdown / HTML."""
