"""Policy as code: ``policies/*.yaml`` loaded into frozen objects and asked before actions."""
