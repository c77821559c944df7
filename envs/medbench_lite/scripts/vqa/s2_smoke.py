"""S2: the model on two dark lungs and one nodule, asked which side."""

import numpy as np
toy = np.full((64, 64), 0.85)
toy[16:48, 8:28] = 0.2
toy[16:48, 36:56] = 0.2
toy[30:35, 14:19] = 0.85
found = infer_lib.find_nodules(toy, W)
smoke = {"input": "two dark lungs, one blob in the image-left lung", "nodules": found,
         "answer_radiological": infer_lib.answer("Which lung contains the largest nodule, left or right (none if there is none)?", found, 64, convention="radiological")}
