"""The gpuwarden node agent: samples GPUs and the host, attributes processes to jobs, exports OTLP.

Importing this package has no side effects and never imports pandas, statsmodels or aiohttp.
"""
