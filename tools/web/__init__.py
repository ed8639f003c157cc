"""The machinery of the web tools, which tools/web_tools.py registers.

- :mod:`.base`: the seams, a search provider and an extract provider;
- :mod:`.providers`: the hosted services (SearXNG, Brave, Tavily; Firecrawl);
- :mod:`.direct`: direct extraction, fetching pages from this host;
- :mod:`.guard`: the network guard that keeps direct fetching off internal addresses;
- :mod:`.markdown`: HTML to markdown;
- :mod:`.client`: the HTTP client they share and the settings it reads;
- :mod:`.errors`: the WebToolError family.

Nothing is imported here: tool discovery imports only tools/web_tools.py, and that
imports what it uses. docs/web.md describes the providers and settings.
"""
