"""The fixed inputs of bench/weights.py: 32 prompts for greedy agreement, and one passage
(about 1,300 tokens of SmolLM2's tokenizer) for perplexity. Written for this bench."""

from bench.workloads import PROMPTS as ENGINE_PROMPTS

PROMPTS = [
    *ENGINE_PROMPTS,  # the engine bench's eight, then 24 more
    "The difference between a virus and a bacterium is",
    "To change a flat tyre on a bicycle, you need to",
    "My favourite season of the year is autumn because",
    "The main causes of the French Revolution were",
    "import json\n\ndef load_config(path):",
    "Dear hiring manager, I am writing to apply for",
    "The rules of chess say that a knight moves",
    "Photosynthesis is the process by which plants",
    "A good night's sleep matters because",
    "SELECT name, age FROM users WHERE",
    "The tallest mountain in Africa is",
    "Here are five tips for learning a new language:",
    "The water cycle has four stages:",
    "In the year 2050, cities will",
    "A haiku about the first snow of winter:",
    "The function of the heart in the human body is to",
    "Why do cats purr? Scientists think that",
    "The Roman Empire fell because",
    "for (int i = 0; i < n; i++) {",
    "The best way to save money on groceries is",
    "Electric cars differ from petrol cars in that",
    "The story of the Trojan horse tells how",
    "A list of the planets in order from the sun:",
    "When I opened the old wooden box, I found",
]

PASSAGE = """\
The old bridge at the edge of the town had stood for more than two hundred years. It was built
of grey stone cut from the hills to the north, and every block had been carried down the valley
on carts pulled by oxen. The builders had no engines and no steel, only ropes, wooden frames and
a great deal of patience. They raised the arches one at a time, resting each stone on a curved
frame of timber until the keystone at the top was set. Then the frame was taken away, and the
arch held itself up by the weight of its own stones pressing against one another.

For a long time the bridge carried farmers and their animals, travelling merchants, soldiers on
their way to distant wars, and children walking to the school on the other side of the river.
In spring the river rose with melted snow and rushed brown and loud beneath the arches. In late
summer it shrank to a slow green stream, and boys fished from the stone ledges under the middle
span. The town grew around the bridge. A market square appeared at its eastern end, and an inn,
a smithy and a small church followed. People said that the town existed because of the bridge,
and that without it the valley would have been nothing more than a place that travellers passed
through on their way to somewhere else.

In the winter of one particularly hard year, the river froze from bank to bank. The ice was so
thick that carts could cross it without using the bridge at all. When the thaw came, great slabs
of ice broke loose upstream and were driven against the piers by the current. The townspeople
gathered on the banks to watch, afraid that the bridge would be torn away. The stones shook and
groaned, and one of the smaller arches near the western bank cracked from top to bottom. But the
bridge did not fall. When the water went down, masons came from the city and repaired the crack
with new stone and mortar. The repair can still be seen today: the new blocks are a little paler
than the old ones, and they form a jagged line across the face of the arch.

As the years passed, the world changed around the bridge. A railway was built along the valley,
and a new iron bridge was put up a mile downstream to carry the trains. Later came motor cars,
which were too wide and too heavy for the old stone road, and a concrete bridge was built beside
the railway. Fewer and fewer people crossed the old bridge. Grass grew between the paving stones,
and the market square moved closer to the station. For a while it seemed that the bridge would
simply be forgotten, or perhaps pulled down to make room for something more useful.

It was saved by a schoolteacher who loved history. She collected old letters, maps and drawings
that mentioned the bridge, and she wrote a small book about it. In the book she described how the
arches had been built, who had paid for them, and how the town had grown up around them. She
told the story of the frozen winter and the cracked arch, and she listed the names of the masons
who had made the repair. The book was read by people far beyond the valley. Visitors began to
arrive, first a few and then many, to walk across the bridge and to see the pale stones of the
old repair. The town council decided that the bridge should be protected, and it was closed to
all traffic except people on foot.

Today the bridge is one of the best known sights in the region. Engineers come to study it,
because it shows how much can be achieved with simple materials when they are used with care.
An arch made of stone does not need glue or bolts to stand; it stands because every stone pushes
against its neighbours, and the force is carried down through the piers into the ground. As long
as the foundations are sound and the shape of the arch is right, such a bridge can last for many
centuries. Modern bridges of steel and concrete can span far greater distances, but they need
constant care: steel rusts, concrete cracks, and cables must be inspected and replaced. The old
stone bridge asks for very little. Every few decades the mortar between the stones is renewed,
and the paving on top is relaid, and that is all.

Children from the school still cross the bridge on their way home, though they no longer need to.
They stop in the middle and lean over the low wall to watch the river flow beneath them, just as
children did two hundred years ago. Sometimes they drop sticks into the water on one side and run
across to see which one comes out first on the other. The game has no winner for long, because
the river carries the sticks away around the bend and out of sight. But the bridge stays where it
is, patient and grey, holding itself up by the weight of its own stones, as it always has.

The people of the town like to say that a bridge is a kind of promise. Whoever builds it promises
that the far bank can be reached, that the river will not divide those who live on either side,
and that the way will still be open tomorrow and the day after. The old bridge has kept that
promise through floods and frosts, through wars and quiet years, through the coming of the
railway and the motor car. It is no longer the only way across the river, and it is no longer the
fastest. But it is the one that people choose when they are not in a hurry, when they want to
stop for a moment in the middle of the crossing and look at the water, the hills and the sky.
"""
