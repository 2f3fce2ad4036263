"""Hand-written document memories for the retrieval tests: two English, one Chinese.

Kept out of ``conftest.py`` because test modules import these names and every test folder's
conftest is imported under the same module name.
"""

from __future__ import annotations

from memreader.core.schema import DocumentMemory, Scenario


def make_memory(doc_id: str, scenarios: list[tuple[str, str, str]]) -> DocumentMemory:
    """A memory whose document is the concatenation of the chunks of ``(outline, core, chunk)``."""
    document, out = "", []
    for outline, core, chunk in scenarios:
        out.append(Scenario(outline, core, len(document), len(document) + len(chunk)))
        document += chunk
    mem = DocumentMemory(doc_id=doc_id, document=document, scenarios=out)
    mem.validate()
    return mem


VOLCANO = make_memory("en-volcano", [
    ("How volcanoes form",
     "Magma forms where tectonic plates meet and rises through weak spots in the crust.",
     "Volcanoes form where molten rock, called magma, rises from the mantle. Most of them sit on the "
     "boundaries of tectonic plates, where one plate sinks under another or two plates pull apart. "),
    ("Explosive and effusive eruptions",
     "Sticky, gas-rich magma explodes into ash; runny basalt magma pours out as lava flows.",
     "Eruptions differ with the magma. Thick magma rich in silica traps gas and explodes into ash clouds, "
     "as at Mount St. Helens; fluid basalt lets gas escape and spreads as lava rivers, as in Hawaii. "),
    ("Monitoring volcanoes to forecast eruptions",
     "Seismometers, GPS ground-deformation stations and gas sensors warn that an eruption is coming.",
     "Observatories watch active volcanoes around the clock. Swarms of small earthquakes on seismometers, "
     "ground swelling measured by GPS and rising sulfur dioxide in the gas plume warn scientists that "
     "magma is moving and an eruption may be near."),
])

# One scenario without core content and one with a blank outline: both rows are skipped, not embedded.
BREAD = make_memory("en-bread", [
    ("Feeding a sourdough starter",
     "A starter is flour and water fermented by wild yeast and lactic bacteria, fed daily.",
     "A sourdough starter is a paste of flour and water colonised by wild yeast and lactic acid bacteria. "
     "Feed it every day with fresh flour and water and it doubles in a few hours. "),
    ("Kneading and gluten", "",
     "Kneading stretches the dough so gluten strands line up into an elastic net that holds the gas. "),
    ("   ",
     "Bake hot with steam first for oven spring, then dry heat for a brown crust.",
     "Bake the loaf at 250 degrees with steam for twenty minutes, then without steam until the crust "
     "turns deep brown and the bottom sounds hollow."),
])

TEA = make_memory("zh-tea", [
    ("绿茶的制作", "绿茶不发酵，鲜叶经过杀青、揉捻和干燥制成。",
     "绿茶是不发酵的茶。鲜叶采摘后先高温杀青，停止酶的活动，再揉捻成形，最后烘干。"),
    ("乌龙茶的半发酵", "乌龙茶是半发酵茶，做青时摇青使叶缘氧化。",
     "乌龙茶属于半发酵茶。做青时反复摇青和晾青，叶片边缘氧化变红，形成绿叶红镶边。"),
    ("泡茶的水温", "绿茶用八十度左右的水，乌龙茶用沸水冲泡。",
     "泡茶的水温很重要：细嫩的绿茶用八十度左右的水，乌龙茶和普洱茶要用一百度的沸水。"),
])

MEMORIES = [VOLCANO, BREAD, TEA]
# Rows a build must write: 9 scenarios; BREAD lacks one core and one outline.
EXPECTED_ROWS = {"outline": 8, "core": 8, "chunk": 9, "single": 9}
EXPECTED_SKIPPED = {"empty core": 1, "empty outline": 1}

# The MeVe tests' question and passages ``(id, title, text)``: two near-copies answer it, the rest do not.
QUESTION = "At what water temperature should green tea be brewed?"
CORPUS = [
    ("tea-temp", "Green tea", "Green tea is brewed with water at about 80 degrees Celsius; boiling water makes it "
     "bitter."),
    ("tea-temp-copy", "Green tea (copy)", "Green tea is brewed with water at about 80 degrees Celsius, because "
     "boiling water makes it bitter."),
    ("tea-time", "Steeping", "Steep green tea for two to three minutes, then lift the leaves out of the pot."),
    ("tea-history", "Tea history", "Tea reached Europe in the seventeenth century on Dutch ships; in England it "
     "became a fashionable drink at court, then spread to coffee houses, and by the nineteenth century the "
     "afternoon tea with cakes and sandwiches had become a fixed custom in middle-class homes."),
    ("kettle", "Kettles", "An electric kettle with a thermostat holds water at a chosen temperature."),
    ("volcano", "Volcanoes", "Magma rises through the crust and erupts as lava from a volcano."),
    ("bread", "Sourdough", "Sourdough bread bakes in a hot oven at 230 degrees Celsius for a brown crust."),
]
