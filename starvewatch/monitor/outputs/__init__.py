"""What leaves the collector: exports (JSON, CSV, Markdown, HTML), figures, Prometheus
metrics, OpenTelemetry and TensorBoard."""
