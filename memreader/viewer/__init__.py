"""The memories viewer (``memreader view``): memories, their candidates and gold boundaries as one offline HTML page.

:mod:`memreader.viewer.documents` reads the files (leniently: a memory that does not tile is shown with the problem
marked), :mod:`memreader.viewer.page` writes the page (its script: ``viewer.js``, inlined).
"""
