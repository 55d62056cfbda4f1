"""The command line: parse the arguments, call the library, render the result.

One module per command group; ``app.main`` is the console entry point.
"""
