"""`ddtree-deploy bench`: sweep server configurations on a deployed service, report, recommend."""
