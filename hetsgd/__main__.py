from hetsgd.entry import main

main()
