"""`python -m ddtree_deploy.cli`: the command line, as the console script runs it."""

from ddtree_deploy.cli.app import main

main()
