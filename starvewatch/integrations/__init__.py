"""Glue for the frameworks people train with; each module is imported only when asked for.

    from starvewatch.integrations.lightning import StarvewatchCallback      # pip install 'starvewatch[lightning]'
    from starvewatch.integrations.huggingface import StarvewatchCallback    # pip install 'starvewatch[hf]'
    from starvewatch.monitor.outputs.otel import OtelExporter                      # pip install 'starvewatch[otel]'

Importing `starvewatch` (or this package) imports none of the frameworks. The glue is thin: it
uses only the public API (`watch`, `init`, `step`, `finish`); what is shared lives in `_common`.
"""
