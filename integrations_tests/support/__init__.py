"""Helpers the tests import or start (model servers, an MCP server, apps); no tests."""
