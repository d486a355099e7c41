"""Developer tools: the benchmarks, the UI's screenshots, the JVM class archive.

They run as modules from the repository's root (`python -m scripts.<name>`, as the Makefile
does), so they import the tests' support modules (`sessionize_tests`, such as the `dagster dev`
driver) as the tests do; none of this is installed with the package.
"""
