"""The load tests' text pool: short, medium and long English sentences on varied topics (data)."""

SHORT_SENTENCES = [
    "Good morning.",
    "Where is the train station?",
    "The coffee is too hot.",
    "Please close the door.",
    "I lost my keys again.",
    "It is raining in Lisbon.",
    "Thank you for your help.",
    "The meeting starts at nine.",
    "My phone battery is dead.",
    "Can I pay by card?",
    "The museum opens on Sunday.",
    "She plays the violin.",
    "We need more chairs.",
    "The bread is still warm.",
    "Turn left at the bakery.",
    "Our flight was delayed.",
    "He forgot his umbrella.",
    "The invoice is attached.",
    "Is this seat taken?",
    "The printer is out of paper.",
    "Dinner will be ready soon.",
    "The river froze last winter.",
    "I prefer green tea.",
    "The kids are asleep.",
    "Call me after lunch.",
    "The server restarted overnight.",
    "Water the plants on Friday.",
    "This soup needs salt.",
    "The shop closes early today.",
    "He runs every morning.",
    "The password has expired.",
    "Bring a warm jacket.",
    "The cat is on the roof.",
    "I will be there in ten minutes.",
    "The library is very quiet.",
]

MEDIUM_SENTENCES = [
    "The new bridge across the river should cut the morning commute by almost twenty minutes.",
    "Could you send me the updated spreadsheet before the end of the afternoon?",
    "My grandmother grew tomatoes, beans and peppers in a small garden behind her house.",
    "The hotel offers free breakfast, but the parking garage costs fifteen euros per night.",
    "After the storm, volunteers spent the whole weekend clearing branches from the park.",
    "The doctor recommended drinking more water and walking at least thirty minutes a day.",
    "Our team fixed the login bug, but the search page is still slower than we would like.",
    "The museum's new exhibition shows maps drawn by sailors in the sixteenth century.",
    "If the package does not arrive by Thursday, please contact customer support.",
    "The recipe calls for two cups of flour, three eggs and a pinch of cinnamon.",
    "Students who miss the exam must present a medical certificate within five days.",
    "The farmers expect a smaller harvest this year because of the long dry summer.",
    "We moved the database to a larger machine and the nightly reports now finish on time.",
    "The orchestra will perform Beethoven's ninth symphony in the cathedral next month.",
    "Her first novel tells the story of a fisherman who finds a message in a bottle.",
    "The city council approved a plan to plant ten thousand trees along the main avenues.",
    "Please remember to switch off the lights and lock the back door when you leave.",
    "The football match was cancelled at the last minute because the pitch was flooded.",
    "Electric buses are quieter than diesel ones and they do not pollute the streets.",
    "I have been learning Portuguese for two years, and I still confuse the verb tenses.",
    "The contract can be renewed for another year if both parties agree in writing.",
    "Scientists discovered a new species of frog in the rainforest near the border.",
    "The train to Porto leaves from platform four and stops at every station on the way.",
    "Our neighbours are renovating their kitchen, so it has been noisy all week.",
    "The bank will never ask you to share your password by email or over the phone.",
    "A good night's sleep improves memory, mood and the ability to concentrate.",
    "The company plans to open three new offices in South America next year.",
    "He repaired the old bicycle with parts he found at the flea market.",
    "The weather forecast predicts sunshine in the morning and thunderstorms in the evening.",
    "Children under twelve must be accompanied by an adult at all times in the pool.",
    "The software update adds a dark mode and fixes several security problems.",
    "She photographed the northern lights during a cold night in the mountains of Norway.",
    "The restaurant on the corner serves grilled sardines with boiled potatoes and salad.",
    "Because of the strike, the subway will run only every twenty minutes tomorrow.",
    "The museum guide explained how the ancient Romans built their aqueducts.",
    "Our customers asked for clearer invoices, so we redesigned the billing page.",
    "The marathon route passes the harbour, the old town and the university campus.",
    "Wash the vegetables carefully and cut them into small pieces before cooking.",
    "The hospital is looking for nurses who can work night shifts on weekends.",
    "Most of the village's young people have moved to the capital to find work.",
    "The telescope captured detailed images of a galaxy millions of light years away.",
    "I would like to book a table for four people on Saturday evening, please.",
    "The storm knocked out power in several neighbourhoods for more than six hours.",
    "The teacher asked the class to write a short essay about their favourite book.",
    "Remember that the tax return must be submitted before the thirtieth of June.",
]

LONG_SENTENCES = [
    "When we arrived at the small village in the mountains, the only restaurant had already "
    "closed, so the owner of the guesthouse cooked us a simple meal of soup, bread and cheese "
    "that tasted better than anything we had eaten all week.",
    "The engineering team spent three months rewriting the payment service, and although the "
    "new version is faster and easier to test, several customers reported that their monthly "
    "statements now arrive a day later than before.",
    "Although the forecast had promised a calm sea, the wind changed direction shortly after "
    "noon, and the fishermen decided to return to the harbour before the waves became too "
    "dangerous for their small wooden boats.",
    "The report concludes that investing in public transport, safe cycling lanes and "
    "affordable housing near the city centre would reduce traffic, improve air quality and "
    "save families a significant part of their monthly budget.",
    "During the nineteenth century, thousands of families left the northern provinces in "
    "search of work, crossing the ocean with little more than a suitcase and the address of "
    "a relative who had made the journey years before.",
    "If you are travelling with children, we recommend booking the seats in advance, bringing "
    "snacks and a few games for the journey, and arriving at the airport at least two hours "
    "before the scheduled departure time.",
    "The researchers followed more than two thousand patients for a decade and found that "
    "those who exercised regularly, ate plenty of vegetables and slept well were far less "
    "likely to develop heart disease.",
    "After months of negotiation, the two companies finally agreed to share their charging "
    "networks, which means that owners of electric cars will be able to use thousands of "
    "additional stations across the country.",
    "The old lighthouse, which had guided ships along the rocky coast for almost two hundred "
    "years, was restored by local volunteers and now houses a small museum about the history "
    "of navigation in the region.",
    "Please read the installation instructions carefully before you begin, because connecting "
    "the cables in the wrong order can damage the device and will not be covered by the "
    "manufacturer's warranty.",
    "My grandfather used to say that the best way to learn a language is to fall in love, "
    "move to another country, or read the same children's book over and over until every "
    "word feels familiar.",
    "The festival attracts musicians from all over the world, and for one week every summer "
    "the streets of the old town are filled with concerts, dancing, food stalls and "
    "thousands of happy visitors.",
    "Our monitoring showed that the latency spikes happened every night at the same time, and "
    "after a long investigation we discovered that a forgotten backup job was copying the "
    "entire database to a remote server.",
    "The committee will review every application carefully, but candidates who do not include "
    "a cover letter, two references and a copy of their diploma will not be considered for "
    "the position.",
    "As the sun set behind the hills, the farmers gathered in the square to celebrate the end "
    "of the harvest with music, roasted chestnuts and the new wine that had been pressed a "
    "few weeks earlier.",
    "The new law requires companies with more than fifty employees to publish the difference "
    "between the average salaries of men and women, and to explain what they are doing to "
    "reduce it.",
    "Even though the hiking trail is well marked, the weather in the mountains can change "
    "very quickly, so always carry a map, enough water, a warm layer and a fully charged "
    "phone.",
    "The library received a donation of rare books from a retired professor, including a "
    "first edition of a famous Portuguese poem and several handwritten letters from the "
    "author to his publisher.",
    "When the volcano erupted, the authorities evacuated the nearby towns within hours, and "
    "thanks to the early warning system nobody was injured, although several houses were "
    "destroyed by the lava.",
    "To reduce costs, the school replaced its old heating system with solar panels and heat "
    "pumps, and the savings are now being used to buy new computers and books for the "
    "students.",
    "The astronauts spent six months on the space station, carrying out experiments on plant "
    "growth, muscle loss and the behaviour of fluids in microgravity, before returning "
    "safely to Earth.",
    "The customer explained that she had ordered a blue sofa, received a green one, and then "
    "waited three weeks for someone to collect it, so she asked for a full refund and an "
    "apology.",
    "Historians believe that the bridge was built by Roman engineers around the second "
    "century, and despite floods, wars and earthquakes it is still used every day by cars "
    "and pedestrians.",
    "Our recommendation is to roll out the change gradually, starting with five percent of "
    "the traffic, watching the error rate and latency closely, and only then moving on to "
    "the rest of the users.",
    "The chef learned to cook in her grandmother's kitchen, worked in restaurants in Paris "
    "and Tokyo, and finally opened a small place by the sea where the menu changes every day "
    "depending on the catch.",
    "Because the river had risen so much after a week of heavy rain, the ferry was suspended "
    "and commuters had to drive almost forty kilometres to the next bridge to reach the "
    "city.",
    "The volunteers teach adults to read and write in the evenings, and many of their students "
    "say that for the first time in their lives they can help their grandchildren with "
    "homework.",
    "Wind and solar power produced more than half of the country's electricity last year, "
    "but experts warn that the grid needs more storage to handle days with little wind and "
    "no sun.",
    "The detective noticed that the clock in the hallway had stopped at exactly a quarter "
    "past ten, the same minute that the neighbour claimed to have heard a loud noise from "
    "the empty house.",
    "Before signing the lease, make sure you understand who is responsible for repairs, how "
    "much notice you must give before leaving, and whether the deposit will be returned in "
    "full.",
]

SENTENCES: list[str] = SHORT_SENTENCES + MEDIUM_SENTENCES + LONG_SENTENCES
