"""Tether for agents over the Model Context Protocol (docs/mcp.md): a Streamable HTTP endpoint at ``/mcp``
whose tools are the API's own calls, with the same bearer tokens, scopes, access rules and refusals."""
